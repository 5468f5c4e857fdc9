"""``toast`` command line: a table of commands (``toast.cli.app.COMMANDS``), each a ``Command``
(``toast.cli.command``): its options, a check of them before any work that returns a small frozen plan, and its
run on the program's analysis. ``analysis_commands``: ``analyze``, ``roles``, ``explain``, ``graph``;
``strategy_commands``: ``shard``, ``cost``, ``autoshard``, ``compare``, ``validate``; ``batch_commands``:
``sweep``, ``calibrate``; ``options``: argparse types and shared option groups. A new command is a ``Command``
in one of those tables.

Problems the user can fix print one line ``toast: error: ...`` and exit 2; no traceback.
"""

from toast.cli.app import main, run

__all__ = ["main", "run"]
