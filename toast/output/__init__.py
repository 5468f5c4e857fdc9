"""Stage 8, output: what toast writes for people, scripts and JAX: the analysis JSON and summary
(``report``), strategy files (``strategy_file``), sharded StableHLO (``sharded_stablehlo``),
``sharded_jit`` (``sharded_jit``), dimension graphs (``dimension_graph``), and whole-or-nothing
file writes (``files``), and ``autoshard``: search end to end, the ``Strategy`` it returns.

The package itself imports nothing: its public names are ``toast``'s (``toast.autoshard``, ``toast.summary``,
...), each loaded from its module on first use, so a command that only writes a report does not import the
search. (Re-exporting them here would make ``toast.output.autoshard`` the function or the module depending on
what was imported before.)"""
