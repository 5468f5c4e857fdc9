"""Automatic sharding end to end: analysis -> action space -> search -> a strategy you can run.

    >>> import toast
    >>> from toast.examples.mlp import mlp
    >>> fn, args = mlp()
    >>> strategy = toast.autoshard(fn, *args, mesh="batch=4,model=2", hardware="a100_80gb",
    ...                            seed=0)                                       # doctest: +SKIP
    >>> strategy.partition_specs["x"]                                            # doctest: +SKIP
    PartitionSpec(('batch', 'model'), None)
    >>> sharded = strategy.apply(fn)      # jax.jit with the strategy's NamedShardings  # doctest: +SKIP
    >>> strategy.save("mlp.strategy.json")                                       # doctest: +SKIP

A ``Strategy`` is a strategy file's document (``toast shard -o``'s format, with a ``search`` section saying
which search, budget and settings produced it) plus the example arguments it was found for; ``load_strategy``
reads one back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toast.cost.hardware import Hardware, load_hardware, memory_limit_gib
from toast.cost.network import check_slices
from toast.errors import ToastError
from toast.output.strategy_file import strategy_json
from toast.search.base import Budget, Search, SpaceSettings, settings_json
from toast.search.find import Found, find_strategy
from toast.sharding.mesh import Mesh, parse_mesh


@dataclass(frozen=True)
class Strategy:
    """A sharding strategy: a strategy file's document, and the example arguments it was made for.

    Attributes:
      document: the strategy file's JSON, checked (``toast.load_strategy``).
      example_args: the example arguments (arrays or ``jax.ShapeDtypeStruct``) when known.
    """

    document: dict[str, Any]
    example_args: tuple[Any, ...] | None = field(default=None, compare=False)

    @property
    def cost(self) -> dict[str, Any]:
        """The estimate, in ``toast cost --json``'s keys (``step_time_s``, ``peak_bytes``, ``breakdown``, ...)."""
        return dict(self.document["cost"])

    @property
    def partition_specs(self) -> dict[str, Any]:
        """``argument name -> jax.sharding.PartitionSpec`` of the lowered function's arguments."""
        from jax.sharding import PartitionSpec

        return {tensor["name"]: PartitionSpec(*[tuple(e) if isinstance(e, list) else e
                                                for e in tensor["partition_spec"]])
                for tensor in self.document["arguments"]}

    @property
    def over_memory(self) -> bool:
        """Whether the strategy's peak is over the memory limit it was searched under."""
        return bool(self.document.get("search", {}).get("over_memory", False))

    def apply(self, fn: Callable[..., Any], *example_args: Any, devices: Sequence[Any] | None = None,
              ) -> Callable[..., Any]:
        """``jax.jit(fn)`` with the strategy's ``NamedSharding``s on arguments and results (intermediates are
        left to XLA's propagation; ``toast autoshard --emit`` writes the module that pins every one).

        Args:
          fn: the function the strategy was made for.
          example_args: its example arguments (default: those the strategy was found with).
          devices: devices for the mesh (default ``jax.devices()``).
        """
        from toast.output.sharded_jit import sharded_jit

        args = example_args or self.example_args
        if args is None:
            raise ToastError("apply(fn, *example_args): this strategy was loaded from a file; give the example "
                             "arguments it was made for")
        return sharded_jit(self.document, fn, args, devices=devices)

    def torch_placements(self) -> Any:
        """The strategy as DTensor placements (``toast.output.torch_placements.TorchPlacements``): one per mesh dim
        for each trained parameter (by ``state_dict`` name) and input of a PyTorch module's step, and what they
        cannot express (``not_expressed``)."""
        from toast.output.torch_placements import torch_placements

        return torch_placements(self)

    def apply_torch(self, module: Any, device_mesh: Any, inputs: Any = None) -> Any:
        """Shard a PyTorch module as the strategy says, with DTensor: each trained parameter becomes, in place, a
        ``DTensor`` parameter in the strategy's placements (``torch.distributed.tensor.distribute_tensor``); returns
        ``inputs`` (a tensor, a tuple of ``forward``'s arguments or a dict of keyword arguments, as the factory the
        strategy was made from gives them) distributed likewise, ``None`` without them. Intermediates, the
        optimizer state and the module's buffers follow DTensor's propagation (``torch_placements().not_expressed``).

        Every rank calls it with the same seeded module and inputs (rank 0's values are split). Run the step under
        ``torch.distributed.tensor.experimental.implicit_replication()`` where ``forward`` makes tensors of its own
        (a Hugging Face model's position ids and masks), then ``full_tensor()`` gathers a parameter back::

            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("batch", "model"))
            inputs = strategy.apply_torch(model, mesh, inputs)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)   # after apply_torch: the new parameters
            with implicit_replication():
                model(**inputs).loss.backward()
                optimizer.step()

        Args:
          module: the ``torch.nn.Module`` the strategy was made for (its parameters' names and shapes are checked).
          device_mesh: a ``DeviceMesh`` of the strategy's mesh: its axes as dims, in order, with their names.
          inputs: the example inputs, of the shapes the strategy was made for.

        Raises:
          ToastError: a mesh of another shape or dim names, a module or inputs the strategy does not name, a layout
            DTensor cannot express (``toast.output.torch_placements.mesh_dim_shards``).
        """
        from toast.output.torch_placements import distribute

        return distribute(self.torch_placements(), module, device_mesh, inputs)

    def save(self, path: str | Path) -> None:
        """Write the strategy file (all or nothing)."""
        from toast.output.files import Output, check_output, json_text, write_outputs

        check_output(str(path), option="path")
        write_outputs([Output("path", Path(path), json_text(self.document))])


def load_strategy(source: str | Path | dict[str, Any]) -> Strategy:
    """A strategy file read back, or a strategy document already loaded, checked against the schema (its
    ``document`` is the file's JSON; ``read_strategy_document`` in ``toast.output.strategy_file`` is the check)."""
    from toast.output.strategy_file import read_strategy_document

    return Strategy(read_strategy_document(source))


def strategy_document(found: Found, *, source: str) -> dict[str, Any]:
    """The strategy file's document of a search's outcome (``toast autoshard -o``'s format), with a ``search``
    section saying which search found it (``algorithm``), with what (``budget``, its own ``settings``, the
    action ``space``'s) and how. ``source``: what the program was read from."""
    result = found.result
    search_section = {
        "origin": found.origin,
        "algorithm": result.algorithm,
        "seed": result.budget.seed,
        "rollouts": result.rollouts,
        "evaluations": result.evaluations,
        "device_memory_bytes": found.device_memory,
        "microbatches": found.microbatches,
        "over_memory": found.over_memory,
        "floor_bytes": found.floor_bytes,
        "pinned": {name: [list(e) if isinstance(e, tuple) else e for e in entries]
                   for name, entries in sorted(found.pinned.items())},
        "rounds": [{"phase": r.phase, "best_relative": r.best_relative, "best_step_time_s": r.best_step_time_s,
                    "rollouts": r.rollouts} for r in result.rounds],
        "budget": result.budget.to_json(),
        "settings": settings_json(result.settings),
        "space": found.space_settings.to_json(),
    }
    return strategy_json(found.model, result.state, result.state.actions, result.cost, source=source,
                         hardware=found.costs.hardware, name="toast", search=search_section)


def autoshard(fn: Callable[..., Any], *example_args: Any, mesh: str | Mesh, hardware: str | Hardware = "a100_80gb",
              slices: int | None = None, pinned: Mapping[str, Sequence] | None = None, seed: int = 0,
              memory_gib: float | None = None, rollouts: int | None = 2000, seconds: float | None = None,
              search: str | Search = "mcts", budget: Budget | None = None, settings: Any = None,
              space_settings: SpaceSettings | None = None, engine: str = "auto", rules: str | Path | None = None,
              variant: str = "default") -> Strategy:
    """Find a sharding of ``fn`` for ``mesh`` on ``hardware``.

    Args:
      fn: the function (a training step, ...).
      example_args: its arguments: arrays or ``jax.ShapeDtypeStruct`` (nothing is allocated).
      mesh: ``"batch=4,model=2"`` or a ``toast.Mesh``.
      hardware: a profile name (``hardware/NAME.toml``), a TOML path, or a ``toast.Hardware``.
      slices: the slices the devices lie on (``toast.Mesh.slices``: TPU slices joined by DCN, the mesh's leading
        axes across them); default: the ``Mesh``'s own, 1 for a mesh string.
      pinned: argument name -> ``PartitionSpec`` the search must keep (e.g. ``{"tokens": P("batch", None)}``).
      seed: the search's seed (same seed, same strategy, on any number of workers).
      memory_gib: memory per device in GiB (default: the profile's).
      rollouts: rollout budget; seconds: time budget (either may be ``None``).
      search: the search: ``"mcts"`` (the default), ``"random"``, ``"greedy"`` (``toast.search.SEARCHES``) or a
        ``toast.search.Search``.
      budget: the whole budget (overrides ``seed``, ``rollouts`` and ``seconds``): ``toast.Budget``.
      settings: the search's own settings (``toast.MctsSettings``, ``RandomSettings``, ``GreedySettings``;
        default: the search's defaults).
      space_settings: the action space's options (``toast.SpaceSettings``).
      engine: the Datalog engine (``"auto"``: Soufflé when installed, else the embedded one).
      rules: a folder of your own ``.dl`` files, added to the package's (as ``toast analyze --rules``).
      variant: the analysis variant (``rules/variants/NAME.toml`` or a TOML path; the file records it).

    Returns:
      the strategy; ``.over_memory`` says when no strategy found fits the memory limit.

    Raises:
      ToastError: ``memory_gib`` NaN, infinite, 0 or less or above 2**30, an unknown search or settings of
        another search (before the analysis), a bad mesh, slices or profile, or the analysis's and search's own
        errors.
    """
    from toast.analysis.named_dimensions import analyze
    from toast.search.registry import resolve_search

    memory_gib = memory_limit_gib(memory_gib)  # before the analysis
    chosen = resolve_search(search)
    settings = chosen.settings(settings)
    if isinstance(mesh, str):
        mesh = parse_mesh(mesh, slices=1 if slices is None else slices)
    elif slices is not None:
        mesh = Mesh(mesh.axes, slices)
    profile = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    check_slices(mesh, profile)
    budget = budget or Budget(seed=seed, rollouts=rollouts, seconds=seconds)
    name = getattr(fn, "__name__", "fn")
    analysis = analyze(name, fn=fn, args=list(example_args), engine=engine,  # type: ignore[arg-type]
                       rules=rules, variant=variant)
    found = find_strategy(analysis, mesh, profile, pinned=pinned, search=chosen, budget=budget, settings=settings,
                          space_settings=space_settings or SpaceSettings(), memory_gib=memory_gib)
    return Strategy(json.loads(json.dumps(strategy_document(found, source=name))), tuple(example_args))
