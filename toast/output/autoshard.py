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
which settings produced it) plus the example arguments it was found for; ``load_strategy`` reads one back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toast.cost.hardware import Hardware, load_hardware
from toast.cost.model import Cost, CostModel
from toast.errors import ToastError
from toast.search.actions import ActionSpace
from toast.search.exhaustive import search_score
from toast.search.mcts import RoundResult, SearchResult, SearchSettings, search
from toast.sharding.mesh import Mesh, parse_mesh
from toast.sharding.propose import roles_or_proposed
from toast.sharding.roles import Roles
from toast.sharding.state import ShardingModel, ShardingState

GIB = 2 ** 30
DEFAULT_SETTINGS = SearchSettings()


@dataclass(frozen=True)
class Strategy:
    """A sharding strategy: a strategy file's document, and the example arguments it was made for.

    Attributes:
      document: the strategy file (``toast.read_strategy``'s form).
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

    def save(self, path: str | Path) -> None:
        """Write the strategy file (all or nothing)."""
        from toast.output.files import Output, check_output, json_text, write_outputs

        check_output(str(path), option="path")
        write_outputs([Output("path", Path(path), json_text(self.document))])


def load_strategy(path: str | Path) -> Strategy:
    """A strategy file read back (checked against the schema)."""
    from toast.output.strategy_file import read_strategy

    return Strategy(read_strategy(path))


@dataclass(frozen=True)
class Comparison:
    """One row of the table against manual strategies: the strategy's name, its cost, and whether it is over
    the memory limit (``cost`` is ``None`` and ``reason`` says why when the strategy does not apply)."""

    name: str
    cost: Cost | None
    over_memory: bool
    reason: str = ""
    state: ShardingState | None = None


@dataclass(frozen=True)
class Found:
    """A search's outcome with everything needed to report it.

    Attributes:
      result: the search's result; where a manual strategy beat it, that strategy's state and cost (and no
        search actions).
      origin: ``"search"``, or the manual strategy chosen instead (``"fsdp+megatron"``).
      floor_bytes: no sharding's peak per device is below this: the buffers live at the unsharded program's
        peak, each split over every device.
      roles: the roles whose manual strategies were candidates: the ones given, else proposed from the
        analysis (``toast.sharding.propose``; ``roles.source`` says which).
      searched: the search's own result, whether or not a manual strategy beat it (``result`` otherwise).
    """

    model: ShardingModel
    space: ActionSpace
    result: SearchResult
    costs: CostModel
    document: dict[str, Any]
    device_memory: float
    origin: str = "search"
    floor_bytes: float = 0.0
    roles: Roles | None = None
    searched: SearchResult | None = None

    @property
    def over_memory(self) -> bool:
        return self.result.cost.peak_bytes > self.device_memory


def find_strategy(analysis, mesh: Mesh, hardware: Hardware, *, source: str,
                  pinned: Mapping[str, Sequence] | None = None, settings: SearchSettings = DEFAULT_SETTINGS,
                  memory_gib: float | None = None, microbatches: int = 1, roles: Roles | None = None,
                  manual_candidates: bool = True,
                  progress: Callable[[RoundResult, int, float], None] | None = None) -> Found:
    """Search a strategy for an analyzed program (what ``toast autoshard`` and ``autoshard`` run).

    Args:
      analysis: the program's analysis.
      mesh: the logical mesh.
      hardware: the accelerator profile.
      source: what the program was read from (recorded in the file).
      pinned: argument name -> PartitionSpec entries the search keeps.
      settings: the search's budget and seed.
      memory_gib: memory per device in GiB (default: the profile's HBM).
      microbatches: micro-batches per step, the gradients reduced once (``CostModel``'s gradient accumulation).
      roles: the program's roles: the manual strategies and their combinations that apply (and keep the pins)
        are candidates too, and one that beats the search's strategy (``search_score``: faster, or fitting
        where the search's does not) is returned instead, named in ``Found.origin`` and the file's
        ``search.origin``. ``None`` or roles naming nothing (no roles file): roles proposed from the analysis
        (``propose_roles``), so the guarantee holds on any program.
      manual_candidates: ``False``: the search's strategy alone (``Found.roles`` is then ``None``), to judge
        the search itself.
      progress: called as the search goes (see ``toast.search.mcts.search``).
    """
    if memory_gib is not None and memory_gib <= 0:
        raise ToastError(f"--memory {memory_gib:g}: give the memory per device in GiB, more than 0")
    device_memory = float(memory_gib * GIB) if memory_gib is not None else float(hardware.hbm_bytes)
    model = ShardingModel(analysis, mesh)
    space = ActionSpace(model, min_names=settings.min_names, mirror_layers=settings.mirror_layers,
                        stored_parameters=settings.stored_parameters, pinned=pinned)
    costs = CostModel(model, hardware, device_memory=device_memory, microbatches=microbatches)
    costs.prepare(space.partition)
    result = searched = search(space, costs, settings=settings, progress=progress)
    origin = "search"
    if manual_candidates:
        roles = roles_or_proposed(roles, analysis)
        result, origin = _best_of_manual(result, model, costs, roles, space)
    else:
        roles = None
    from toast.output.strategy_file import strategy_json

    over = result.cost.peak_bytes > device_memory
    floor = float(costs.initial[4]) / mesh.devices
    search_section = {
        "origin": origin,
        "seed": settings.seed,
        "rollouts": result.rollouts,
        "evaluations": result.evaluations,
        "device_memory_bytes": device_memory,
        "microbatches": microbatches,
        "over_memory": over,
        "floor_bytes": floor,
        "pinned": {name: [list(e) if isinstance(e, tuple) else e for e in entries]
                   for name, entries in sorted((pinned or {}).items())},
        "rounds": [{"phase": r.phase, "best_relative": r.best_relative, "best_step_time_s": r.best_step_time_s,
                    "rollouts": r.rollouts} for r in result.rounds],
        "settings": settings.to_json(),
    }
    document = strategy_json(model, result.state, result.state.actions, result.cost, source=source,
                             hardware=hardware, name="toast", search=search_section)
    return Found(model, space, result, costs, document, device_memory, origin, floor, roles, searched)


def _best_of_manual(result: SearchResult, model: ShardingModel, costs: CostModel, roles: Roles,
                    space: ActionSpace) -> tuple[SearchResult, str]:
    """The search's result, or the manual strategy (``_price_manual``'s order; the first among equals) that
    keeps the pins and beats it under ``search_score``, as a result with no search actions, and its name."""
    import dataclasses

    best, origin = search_score(result.cost, costs), "search"
    for row in _price_manual(model, costs, roles):
        if row.cost is None or row.state is None or not space.keeps_pins(row.state):
            continue
        score = search_score(row.cost, costs)
        if score < best - 1e-12:
            best, origin = score, row.name
            result = dataclasses.replace(result, state=row.state, actions=(), cost=row.cost)
    return result, origin


def compare_manual(found: Found, roles: Roles | None = None) -> list[Comparison]:
    """Every manual strategy (``toast.STRATEGIES``, then the ``COMPOSITES``) priced under the same model and
    memory limit, from ``roles`` (default: the search's candidates', ``found.roles``); one that does not apply
    (a role the roles lack, an invalid state) has its reason instead of a cost."""
    roles = roles if roles is not None else found.roles
    return _price_manual(found.model, found.costs, roles) if roles is not None else []


def _price_manual(model: ShardingModel, costs: CostModel, roles) -> list[Comparison]:
    from toast.sharding.strategies import COMPOSITES, STRATEGIES, manual_strategy

    rows = []
    for name in STRATEGIES + COMPOSITES:
        try:
            state, _ = manual_strategy(model, name, roles)
        except ToastError as err:
            rows.append(Comparison(name, None, False, str(err).split(";")[0]))
            continue
        cost = costs.evaluate(state)
        rows.append(Comparison(name, cost, cost.peak_bytes > costs.device_memory, state=state))
    return rows


def autoshard(fn: Callable[..., Any], *example_args: Any, mesh: str | Mesh, hardware: str | Hardware = "a100_80gb",
              pinned: Mapping[str, Sequence] | None = None, seed: int = 0, memory_gib: float | None = None,
              rollouts: int | None = 2000, seconds: float | None = None, settings: SearchSettings | None = None,
              engine: str = "auto") -> Strategy:
    """Find a sharding of ``fn`` for ``mesh`` on ``hardware``.

    Args:
      fn: the function (a training step, ...).
      example_args: its arguments: arrays or ``jax.ShapeDtypeStruct`` (nothing is allocated).
      mesh: ``"batch=4,model=2"`` or a ``toast.Mesh``.
      hardware: a profile name (``hardware/NAME.toml``), a TOML path, or a ``toast.Hardware``.
      pinned: argument name -> ``PartitionSpec`` the search must keep (e.g. ``{"tokens": P("batch", None)}``).
      seed: the search's seed (same seed, same strategy, on any number of workers).
      memory_gib: memory per device in GiB (default: the profile's).
      rollouts: rollout budget; seconds: time budget (either may be ``None``).
      settings: every search setting (overrides ``seed``, ``rollouts`` and ``seconds``).
      engine: the Datalog engine (``"auto"``: Soufflé when installed, else the embedded one).

    Returns:
      the strategy; ``.over_memory`` says when no strategy found fits the memory limit.
    """
    from toast.analysis.named_dimensions import analyze

    mesh = parse_mesh(mesh) if isinstance(mesh, str) else mesh
    profile = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    settings = settings or SearchSettings(seed=seed, rollouts=rollouts, seconds=seconds)
    name = getattr(fn, "__name__", "fn")
    analysis = analyze(name, fn=fn, args=list(example_args), engine=engine)  # type: ignore[arg-type]
    found = find_strategy(analysis, mesh, profile, source=name, pinned=pinned, settings=settings,
                          memory_gib=memory_gib)
    return Strategy(json.loads(json.dumps(found.document)), tuple(example_args))
