"""Run a strategy with JAX: a function jitted with the strategy's ``NamedSharding``s.

    >>> fn, args = toast.examples.mlp.mlp()
    >>> sharded = sharded_jit("strategy.json", fn, args)   # doctest: +SKIP
    >>> out = sharded(*real_args)                           # doctest: +SKIP
    >>> sharded = sharded_jit(toast.autoshard(fn, *args, mesh="batch=4,model=2"), fn)  # doctest: +SKIP

The strategy file (``toast shard -o``) gives one ``PartitionSpec`` per argument and result of
the lowered ``@main``; they become ``in_shardings``/``out_shardings`` over a
``jax.sharding.Mesh`` of the first ``prod(sizes)`` devices in row-major order (the device
order ``toast validate`` uses). Before that, ``fn`` is lowered on ``args`` and its program
fingerprint compared with the strategy's, so a strategy never shards another program.

Intermediates are left to XLA's propagation from the argument and result shardings: JAX
offers no public hook to pin a value of the lowered module from outside the function (inside
it, ``jax.lax.with_sharding_constraint``). The module that pins every intermediate is the
one ``toast shard --emit`` writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from toast.errors import ToastError


class StrategyLike(Protocol):
    """What ``sharded_jit`` reads of a ``toast.Strategy`` (named so, not imported: ``Strategy.apply`` calls
    ``sharded_jit``)."""

    @property
    def document(self) -> dict[str, Any]: ...

    @property
    def example_args(self) -> tuple[Any, ...] | None: ...


def named_shardings(strategy: dict[str, Any], *, devices: Sequence[Any] | None = None) -> tuple[Any, list, list]:
    """``(mesh, argument shardings, result shardings)`` of a strategy document, flat.

    Args:
      strategy: the document of a strategy file (``toast.output.strategy_file.read_strategy_document``).
      devices: the devices to lay the mesh over (default: ``jax.devices()``, first N).
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    axes = [(str(name), int(size)) for name, size in strategy["mesh"]["axes"]]
    count = int(np.prod([size for _, size in axes]))
    pool = list(devices) if devices is not None else jax.devices()
    if len(pool) < count:
        raise ToastError(f"the strategy's mesh needs {count} devices, JAX has {len(pool)} (on CPU, set "
                         f"JAX_NUM_CPU_DEVICES={count} before JAX starts)")
    mesh = Mesh(np.array(pool[:count]).reshape([size for _, size in axes]), tuple(name for name, _ in axes))

    def sharding(entry: dict[str, Any]) -> Any:
        spec = [tuple(axis) if isinstance(axis, list) else axis for axis in entry["partition_spec"]]
        return NamedSharding(mesh, PartitionSpec(*spec))

    return mesh, [sharding(a) for a in strategy["arguments"]], [sharding(r) for r in strategy["results"]]


def sharded_jit(strategy: StrategyLike | dict[str, Any] | str | Path, fn: Callable[..., Any],
                args: Sequence[Any] | None = None, *, devices: Sequence[Any] | None = None) -> Callable[..., Any]:
    """``jax.jit(fn, in_shardings=..., out_shardings=...)`` for the strategy.

    Args:
      strategy: a ``toast.Strategy`` (what ``toast.autoshard`` and ``toast.load_strategy`` return), a strategy
        document, or the path of a strategy file.
      fn: the function the strategy was made for.
      args: example arguments (arrays or ``jax.ShapeDtypeStruct``), as given to ``toast`` (default: those a
        ``Strategy`` from ``toast.autoshard`` holds).
      devices: devices for the mesh (default ``jax.devices()``).

    Raises:
      ToastError: the strategy was made for another program, there are too few devices, or no example
        arguments are known.
    """
    import jax

    from toast.frontend.stablehlo import lower_callable, read_text
    from toast.output.strategy_file import read_strategy_document

    if not isinstance(strategy, dict | str | Path):  # a toast.Strategy
        if not isinstance(getattr(strategy, "document", None), dict):
            raise ToastError(f"sharded_jit: not a strategy: {type(strategy).__name__} (give a toast.Strategy, a "
                             "strategy document or a strategy file's path)")
        args = strategy.example_args if args is None else args
        strategy = strategy.document
    if args is None:
        raise ToastError("sharded_jit(strategy, fn, args): give the example arguments the strategy was made for (a "
                         "strategy read from a file does not hold them)")
    document = read_strategy_document(strategy)
    program = read_text(lower_callable(fn, args), source=getattr(fn, "__name__", "fn"))
    if program.fingerprint() != document["fingerprint"]:
        raise ToastError(f"strategy file for another program (fingerprint {document['fingerprint']}, "
                         f"{program.name} has {program.fingerprint()})")
    _, arg_shardings, result_shardings = named_shardings(document, devices=devices)
    leaves, treedef = jax.tree_util.tree_flatten(tuple(args))
    if len(leaves) != len(arg_shardings):
        # jax.jit drops unused arguments from the module; the strategy then has fewer.
        raise ToastError(f"the strategy has {len(arg_shardings)} arguments, the function takes {len(leaves)} arrays "
                         "(an unused argument? strategies cover the arguments of the lowered module)")
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *args))
    return jax.jit(fn, in_shardings=jax.tree_util.tree_unflatten(treedef, arg_shardings),
                   out_shardings=jax.tree_util.tree_unflatten(out_tree, result_shardings))
