"""Expert strategies: the shardings experts write by hand, one declaration each (the search's baselines).

A strategy is built from *roles* (``toast.sharding.roles``): the dims of named function
arguments that play a part in the model (the batch dim of the tokens, the heads dim of the
attention weights, the experts dim of a mixture of experts' weights, ...). A role names colors, so
the strategies need no knowledge of the program beyond argument names.

``EXPERT_STRATEGIES`` is the one table: an ``ExpertStrategy`` per strategy says which role goes on
which mesh axes (an *axis choice* per role, resolved on the mesh) and, for FSDP, the axes every
parameter is stored split over. ``toast shard --strategy NAME``, ``toast cost``, ``toast compare``'s
rows and the search's candidates (``toast.search.find.price_manual_strategies``) all read it. The rows:

- ``data_parallel``: the batch on the data axis.
- ``megatron``: data parallel, plus the attention heads and the MLP hidden colors on the model axis
  (Megatron-LM tensor parallelism; Figure 2c for the MLP).
- ``fsdp``: data parallel, plus every parameter (a floating-point argument the batch role leaves
  unsharded) stored split over the batch's axes on its largest divisible dim (ZeRO-3): gathered
  where it is used, its update chain (the elementwise ops from the parameter to the new parameter
  returned) sharded alike, so the gradient arrives by reduce-scatter.
- ``sequence``: data parallel, plus the sequence color on the model axis with resolution bits ``1``
  (the sequence sharding of Figure 5b in every attention).
- ``fsdp+megatron`` (the U-Net's manual baseline), ``fsdp+sequence``, ``megatron+sequence`` and
  ``fsdp+megatron+sequence`` (the Transformers': the best of every combination), the paper's
  composites: Megatron and sequence actions first, each on its axis; FSDP then stores every parameter
  not split along the batch's axes on its largest dim still whole, so a Megatron-split weight is split
  along both. A ``+`` name may give its parts in any order (``sequence+megatron+fsdp``).
- ``data_parallel_all``: the batch over every axis (data parallelism over all devices).
- ``fsdp_all``: the batch over every axis and every parameter stored split over every axis (ZeRO-3
  over all devices; on a 2-axis mesh, the FSDP no single-axis strategy reaches).
- ``fsdp_data_axes+megatron``: Megatron on the model axis, the batch over every other axis and the
  parameters stored over those (2-D FSDP with tensor parallelism); on a mesh of three axes or more
  (on two it is ``fsdp+megatron``).
- ``maxtext``: MaxText's default logical axis rules (``MAXTEXT_RULES``, from MaxText's configs/base.yml)
  as roles: the batch over ``data`` x ``fsdp`` x ``fsdp_transpose`` x ``expert`` (``activation_batch``),
  the heads over ``tensor`` (``heads``), the MLP hidden dim over ``tensor`` (``activation_mlp``), the
  sequence over ``sequence`` x ``context`` (``activation_length``), the experts over ``expert`` (``exp``),
  every parameter stored over ``fsdp`` x ``fsdp_transpose`` x ``sequence`` x ``context`` x ``expert``
  (``embed``), each where the mesh has the axis (toast's usual names count as MaxText's: ``batch``/``dp``
  is ``data``, ``model``/``tp``/``mp`` is ``tensor``, ``seq``/``sp`` is ``sequence``, ``ep``/``exp`` is
  ``expert``). Where the roles name the experts, the expert axis is theirs and the batch leaves it
  (MaxText's ``activation_batch_no_exp`` in the MoE layers). Left out: a role is one color, so a weight's
  rule and its activation's cannot differ: the MLP hidden dim is not on ``fsdp_transpose`` (the ``mlp``
  weight rule), where the batch is; the parameters are stored on their largest dim still whole (toast's
  FSDP), not on the ``embed`` dim as such; the vocabulary rules (``vocab``, ``activation_vocab``), the
  KV-cache rules, ``stage`` (pipelining) and the attention layers' ``*_no_exp`` variants have no role.
- ``expert_parallel``: the experts dim of a mixture of experts on the expert axis, the batch over
  every other axis (GShard's expert parallelism: the dispatch and combine become all-to-alls).

Axis choices: ``"data"`` the data axis (named ``batch``, ``data``, ``dp``, ``fsdp`` or
``fsdp_transpose``, else the first); ``"data_axes"`` every axis the strategy's other roles leave;
``"all"`` every axis; ``"batch"`` (parameters only) the batch's axes; ``"model"`` the axis named
``model``, ``tensor``, ``tp`` or ``mp``, ``"sequence"`` one named ``sequence``, ``seq``, ``sp`` or
``context`` (else a model axis), ``"expert"`` one named ``expert``, ``ep`` or ``exp``, each else the
first axis the batch leaves; a tuple of axis names: every mesh axis of those names or their synonyms
(``AXIS_SYNONYMS``: ``data`` is also ``batch``, ``tensor`` is also ``model``, ...), in that order, a
role whose names the mesh lacks left unplaced. A strategy that cannot place its batch, or a model role
it needs, does not apply (a one-line reason). A roles file's ``[axes]`` table (``Roles.axes``) says
otherwise, role by role, for every strategy, and may name several axes: ``batch = ["data", "fsdp"]``
puts the batch color on both (one action per axis, a dim split over ``data`` x ``fsdp``), and
``params = ["fsdp"]`` stores FSDP's parameters over those axes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from toast.analysis.named_dimensions import Analysis
from toast.errors import ToastError
from toast.sharding.carry import carried_nodes, carried_nodes_many
from toast.sharding.mesh import Mesh
from toast.sharding.roles import PROPOSED_SOURCE, ROLE_NAMES, Roles
from toast.sharding.state import Action, InvalidState, ShardingModel, ShardingState, ShardNodes

DATA_AXIS_NAMES = ("batch", "data", "dp", "fsdp", "fsdp_transpose")
MODEL_AXIS_NAMES = ("model", "tensor", "tp", "mp")
SEQUENCE_AXIS_NAMES = ("sequence", "seq", "sp", "context", *MODEL_AXIS_NAMES)
EXPERT_AXIS_NAMES = ("expert", "ep", "exp")
# A name in a tuple axis choice (MaxText's) -> the other names meshes give that axis.
AXIS_SYNONYMS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "data": ("batch", "dp"), "tensor": ("model", "tp", "mp"), "sequence": ("seq", "sp"), "expert": ("ep", "exp")})

AxisChoice = str | tuple[str, ...]
DATA, DATA_AXES, ALL, BATCH = "data", "data_axes", "all", "batch"
MODEL, SEQUENCE, EXPERT = "model", "sequence", "expert"
# A model role's choice -> the axis names it prefers (else the first axis the batch leaves).
_PREFERRED = {MODEL: MODEL_AXIS_NAMES, SEQUENCE: SEQUENCE_AXIS_NAMES, EXPERT: EXPERT_AXIS_NAMES}
_BATCH_CHOICES = (DATA, DATA_AXES, ALL)
_COUNTS = {2: ("two", "batch=4,model=2"), 3: ("three", "data=2,fsdp=2,model=2")}


@dataclass(frozen=True, slots=True)
class ExpertStrategy:
    """One expert strategy, declared: which role goes on which mesh axes.

    Attributes:
      name: what ``--strategy`` takes; parts joined by ``+`` (``fsdp+megatron``) may come in any order.
      doc: what it is, in one line.
      placements: ``(role, axis choice)`` pairs, the batch first, in the order their actions apply; a role
        the roles lack is skipped (``needs`` says which must be there). The module docstring lists the choices.
      params: the axes FSDP stores every parameter split over (an axis choice; ``"batch"``: the batch's), or
        ``None``: parameters stay as the placements leave them.
      needs: the roles it needs, one role of each tuple.
      min_axes: the mesh axes it needs; on fewer it does not apply.
      paper: one of the paper's manual baselines (``STRATEGIES``, ``COMPOSITES``).
    """

    name: str
    doc: str
    placements: tuple[tuple[str, AxisChoice], ...]
    params: AxisChoice | None = None
    needs: tuple[tuple[str, ...], ...] = (("batch",),)
    min_axes: int = 1
    paper: bool = False

    def __post_init__(self) -> None:
        roles = [role for role, _ in self.placements]
        if not roles or roles[0] != "batch" or len(set(roles)) < len(roles):
            raise ValueError(f"{self.name}: placements start with the batch and name each role once")
        for role, choice in self.placements:
            if role not in ROLE_NAMES:
                raise ValueError(f"{self.name}: unknown role {role!r}")
            allowed = _BATCH_CHOICES if role == "batch" else tuple(_PREFERRED)
            if not isinstance(choice, tuple) and choice not in allowed:
                raise ValueError(f"{self.name}: {role} on {choice!r}, not one of {allowed} or a tuple of names")
        if self.params is not None and not isinstance(self.params, tuple) and self.params not in (BATCH, ALL):
            raise ValueError(f"{self.name}: params on {self.params!r}")


_BATCH_ON_DATA: tuple[tuple[str, AxisChoice], ...] = (("batch", DATA),)
_MEGATRON: tuple[tuple[str, AxisChoice], ...] = (("heads", MODEL), ("mlp", MODEL))
_SEQUENCE: tuple[tuple[str, AxisChoice], ...] = (("sequence", SEQUENCE),)
_NEEDS_MEGATRON = (("heads", "mlp"),)
_NEEDS_SEQUENCE = (("sequence",),)

# MaxText's default logical_axis_rules (MaxText/configs/base.yml, AI-Hypercomputer/maxtext), as roles: the
# rule of each logical axis the roles stand for, MaxText's mesh axis names in the rule's order.
MAXTEXT_RULES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "batch": ("data", "fsdp", "fsdp_transpose", "expert"),  # activation_batch
    "heads": ("tensor", "tensor_transpose", "tensor_sequence", "autoregressive"),  # heads
    "mlp": ("tensor", "tensor_transpose", "tensor_sequence"),  # activation_mlp
    "sequence": ("sequence", "context"),  # activation_length, less the expert axis the batch has
    "experts": ("expert",),  # exp
    "params": ("fsdp", "fsdp_transpose", "sequence", "context", "expert"),  # embed
})
# The one table of expert strategies (``STRATEGY_NAMES`` in this order).
EXPERT_STRATEGIES: tuple[ExpertStrategy, ...] = (
    ExpertStrategy("data_parallel", "data parallelism: the batch on the data axis", _BATCH_ON_DATA, paper=True),
    ExpertStrategy("megatron", "data parallel, the attention heads and the MLP hidden dims on the model axis "
                   "(Megatron-LM)", _BATCH_ON_DATA + _MEGATRON, needs=(("batch",), *_NEEDS_MEGATRON), min_axes=2,
                   paper=True),
    ExpertStrategy("fsdp", "data parallel, every parameter stored split over the batch's axes (ZeRO-3)",
                   _BATCH_ON_DATA, params=BATCH, paper=True),
    ExpertStrategy("sequence", "data parallel, the sequence on the model (sequence) axis", _BATCH_ON_DATA + _SEQUENCE,
                   needs=(("batch",), *_NEEDS_SEQUENCE), min_axes=2, paper=True),
    ExpertStrategy("fsdp+megatron", "Megatron, then FSDP over the data axis", _BATCH_ON_DATA + _MEGATRON,
                   params=BATCH, needs=(("batch",), *_NEEDS_MEGATRON), min_axes=2, paper=True),
    ExpertStrategy("fsdp+sequence", "sequence parallel, then FSDP over the data axis", _BATCH_ON_DATA + _SEQUENCE,
                   params=BATCH, needs=(("batch",), *_NEEDS_SEQUENCE), min_axes=2, paper=True),
    ExpertStrategy("megatron+sequence", "Megatron and the sequence on the model axes",
                   _BATCH_ON_DATA + _MEGATRON + _SEQUENCE, needs=(("batch",), *_NEEDS_MEGATRON, *_NEEDS_SEQUENCE),
                   min_axes=2, paper=True),
    ExpertStrategy("fsdp+megatron+sequence", "Megatron and the sequence, then FSDP over the data axis",
                   _BATCH_ON_DATA + _MEGATRON + _SEQUENCE, params=BATCH,
                   needs=(("batch",), *_NEEDS_MEGATRON, *_NEEDS_SEQUENCE), min_axes=2, paper=True),
    ExpertStrategy("data_parallel_all", "data parallelism over all devices: the batch over every axis",
                   (("batch", ALL),)),
    ExpertStrategy("fsdp_all", "FSDP over all devices: the batch over every axis, every parameter stored split "
                   "over every axis", (("batch", ALL),), params=BATCH),
    ExpertStrategy("fsdp_data_axes+megatron", "Megatron on the model axis, the batch and the stored parameters "
                   "over every other axis", (("batch", DATA_AXES), *_MEGATRON), params=BATCH,
                   needs=(("batch",), *_NEEDS_MEGATRON), min_axes=3),
    ExpertStrategy("maxtext", "MaxText's default logical axis rules",
                   tuple((role, MAXTEXT_RULES[role]) for role in ("batch", "heads", "mlp", "sequence", "experts")),
                   params=MAXTEXT_RULES["params"]),
    ExpertStrategy("expert_parallel", "expert parallelism: the experts on the expert axis, the batch over every "
                   "other axis", (("batch", DATA_AXES), ("experts", EXPERT)), needs=(("batch",), ("experts",)),
                   min_axes=2),
)
STRATEGY_NAMES = tuple(strategy.name for strategy in EXPERT_STRATEGIES)
# The paper's manual baselines: the four strategies and their composites (each includes data parallelism).
STRATEGIES = tuple(s.name for s in EXPERT_STRATEGIES if s.paper and "+" not in s.name)
COMPOSITES = tuple(s.name for s in EXPERT_STRATEGIES if s.paper and "+" in s.name)
# Strategy -> the roles it needs: one role of each tuple.
NEEDS: Mapping[str, tuple[tuple[str, ...], ...]] = MappingProxyType(
    {strategy.name: strategy.needs for strategy in EXPERT_STRATEGIES})
_BY_PARTS = {frozenset(strategy.name.split("+")): strategy for strategy in EXPERT_STRATEGIES}


def expert_strategy(name: str) -> ExpertStrategy:
    """The table's row named ``name`` (a ``+`` name's parts in any order: ``sequence+megatron+fsdp``).

    Raises:
      ToastError: an unknown name, or a part given twice.
    """
    parts = [part.strip() for part in name.split("+")]
    strategy = _BY_PARTS.get(frozenset(parts)) if len(set(parts)) == len(parts) else None
    if strategy is None:
        raise ToastError(f"unknown strategy '{name}' (known: {', '.join(STRATEGY_NAMES)}; combine fsdp, megatron "
                         "and sequence with '+')")
    return strategy


def check_strategy(name: str, *, roles: Roles | None, mesh: Mesh) -> None:
    """Fail early, before any analysis, when strategy ``name`` cannot run with ``roles`` on ``mesh``
    (``roles=None``: roles to be proposed from the analysis, so only the name and the mesh are checked).

    Raises:
      ToastError: one line: an unknown strategy, a mesh of fewer axes than it needs (``min_axes``), a role it
        needs (``ExpertStrategy.needs``) that ``roles`` lack, or an ``[axes]`` entry naming an axis the mesh lacks.
    """
    strategy = expert_strategy(name)
    if len(mesh.names) < strategy.min_axes:
        count, example = _COUNTS[strategy.min_axes]
        raise ToastError(f"strategy '{name}' needs a mesh with {count} axes, e.g. {example}")
    if roles is None:
        return
    for key, axes in roles.axes.items():
        for axis in axes:
            if axis not in mesh.names:
                raise ToastError(f"{roles.source}: [axes] {key} names mesh axis '{axis}', which the mesh "
                                 f"{mesh.spec()} lacks")
    for alternatives in strategy.needs:
        if not any(roles.get(role) for role in alternatives):
            wanted = " or ".join(f"'{role}'" for role in alternatives)
            where = "--roles FILE or --batch ARG:DIM" if alternatives == ("batch",) else "--roles FILE"
            given = ("; the roles proposed from the analysis lack it" if roles.source == PROPOSED_SOURCE
                     else f", which {roles.source} does not name" if roles.dims else f": {roles.source}")
            raise ToastError(f"strategy '{name}' needs role {wanted}{given}; give it in {where}")


def strategy_parts(name: str) -> tuple[str, ...]:
    """The parts of the table's row ``name`` resolves to (``"megatron+fsdp"`` -> ``("fsdp", "megatron")``; a
    plain name is itself).

    Raises:
      ToastError: an unknown name or part, or a part given twice.
    """
    return tuple(expert_strategy(name).name.split("+"))


def role_colors(analysis: Analysis, roles: Roles, role: str) -> list[int]:
    """Colors of the argument dims ``role`` names (sorted, distinct); a one-line error naming the
    roles' source and some of the program's arguments when it names none."""
    names = [name for pattern, dim in roles.get(role) for name in _argument_dims(analysis, pattern, dim)]
    colors = set(np.asarray(analysis.color_of)[np.asarray(names, dtype=np.int64)].tolist())
    if not colors:
        raise ToastError(f"{roles.source}: role '{role}' names no argument dim of {analysis.program.name} "
                         f"({_some_arguments(analysis)})")
    return sorted(colors)


# The last analysis's arguments by name, and its answers by (pattern, dim): every strategy of a comparison reads
# the same roles, and a 70B step's proposed roles name thousands of arguments (a regex over every argument name
# each was most of pricing the strategies).
_LAST_DIMS: list[tuple[Analysis, dict[str, list[int]], dict[tuple[str, int], tuple[int, ...]]]] = []


def _argument_dims(analysis: Analysis, pattern: str, dim: int) -> list[int]:
    """Definition names of dim ``dim`` of the arguments whose name matches ``pattern``, a glob
    where only ``*`` is special (argument names contain brackets)."""
    program = analysis.program
    if not (_LAST_DIMS and _LAST_DIMS[0][0] is analysis):
        by_name: dict[str, list[int]] = {}
        for value_id in program.arguments:
            by_name.setdefault(program.values[value_id].name, []).append(value_id)
        _LAST_DIMS[:] = [(analysis, by_name, {})]
    _, by_name, answers = _LAST_DIMS[0]
    found = answers.get((pattern, dim))
    if found is None:
        if "*" in pattern:
            regex = re.compile(re.escape(pattern).replace(r"\*", ".*"))
            values = [v for v in program.arguments if regex.fullmatch(program.values[v].name)]
        else:  # no wildcard: the names equal to the pattern
            values = by_name.get(pattern, [])
        found = answers[(pattern, dim)] = tuple(analysis.names.def_base[v] + dim for v in values
                                                if dim < len(program.values[v].shape))
    return list(found)


def _some_arguments(analysis: Analysis, shown: int = 8) -> str:
    """``arguments: x (2x8x16), params['w1'] (16x32), ...`` for messages."""
    program = analysis.program
    names = [f"{program.values[v].name} ({'x'.join(map(str, program.values[v].shape)) or 'scalar'})"
             for v in program.arguments]
    more = f", ... {len(names)} in all" if len(names) > shown else ""
    return "arguments: " + (", ".join(names[:shown]) + more if names else "none")


def _data_axis(mesh: Mesh) -> str:
    """The mesh axis data parallelism uses: named like one (``DATA_AXIS_NAMES``), else the first."""
    return next((axis for axis in mesh.names if axis in DATA_AXIS_NAMES), mesh.names[0])


def _model_axis(mesh: Mesh, preferred: tuple[str, ...], *, data_axes: Sequence[str]) -> str:
    """The mesh axis model parallelism uses: the first ``preferred`` name the mesh has, else
    the first axis other than ``data_axes`` (the batch's)."""
    others = [axis for axis in mesh.names if axis not in data_axes]
    if not others:
        raise ToastError(f"the batch takes every axis of mesh {mesh.spec()} ({', '.join(data_axes)}); the model "
                         "roles need one it leaves, or their own in the roles' [axes] table")
    return next((axis for name in preferred for axis in others if axis == name), others[0])


def _named_axes(names: tuple[str, ...], mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes of ``names`` or their synonyms (``AXIS_SYNONYMS``), in the order of ``names``."""
    found = [axis for name in names for synonym in (name, *AXIS_SYNONYMS.get(name, ())) for axis in mesh.names
             if axis == synonym]
    return tuple(dict.fromkeys(found))


def _batch_axes(choice: AxisChoice, mesh: Mesh, *, taken: set[str] | None) -> tuple[str, ...]:
    """The batch's axes for ``choice``, leaving ``taken`` (the other roles' axes) to them; ``taken=None``: a
    first guess, before the other roles are placed (their default axis is one the batch leaves)."""
    if choice == DATA:
        return (_data_axis(mesh),)
    if choice == ALL:
        return mesh.names
    if choice == DATA_AXES and taken is None:
        return tuple(axis for axis in mesh.names if axis in DATA_AXIS_NAMES) or mesh.names[:1]
    axes = mesh.names if choice == DATA_AXES else _named_axes(tuple(choice), mesh)
    return tuple(axis for axis in axes if axis not in (taken or ()))


def placed_axes(strategy: ExpertStrategy, mesh: Mesh, roles: Roles) -> dict[str, tuple[str, ...]]:
    """Where ``strategy`` puts each role on ``mesh``: role -> its mesh axes (major to minor) for the batch and
    each other role of its placements that ``roles`` name, and ``"params"`` -> FSDP's storage axes; each a
    role's ``[axes]`` entry in ``roles``, else its axis choice resolved (the module docstring). A role whose
    named axes the mesh lacks (``maxtext``'s ``context`` on a mesh without one) is left out.

    Raises:
      ToastError: one line: no axis for the batch, or none left for a model role.
    """
    choices = dict(strategy.placements)
    guess = roles.axes_of("batch") or _batch_axes(choices["batch"], mesh, taken=None)
    placed: dict[str, tuple[str, ...]] = {}
    for role, choice in strategy.placements[1:]:
        if not roles.get(role):
            continue
        axes = roles.axes_of(role) or (_named_axes(choice, mesh) if isinstance(choice, tuple) else
                                       (_model_axis(mesh, _PREFERRED[choice], data_axes=guess),))
        if axes:
            placed[role] = axes
    batch = roles.axes_of("batch") or _batch_axes(choices["batch"], mesh, taken={a for v in placed.values() for a in v})
    if not batch:
        wanted = (f"an axis named {', '.join(choices['batch'])}" if isinstance(choices["batch"], tuple)
                  else "an axis the other roles leave")
        raise ToastError(f"strategy '{strategy.name}' finds no axis of mesh {mesh.spec()} for the batch ({wanted})")
    placed = {"batch": batch, **placed}
    if strategy.params is not None:
        params = strategy.params
        stored = roles.axes_of("params") or (_named_axes(params, mesh) if isinstance(params, tuple) else
                                             mesh.names if params == ALL else batch)
        if stored:
            placed["params"] = stored
    return placed


def manual_strategy(model: ShardingModel, name: str, roles: Roles
                    ) -> tuple[ShardingState, tuple[Action | ShardNodes, ...]]:
    """Apply the expert strategy ``name`` (a row of ``EXPERT_STRATEGIES``) on ``model``'s mesh; returns the
    state and its actions: each placed role's colors on its axes (``placed_axes``), in the placements' order,
    the sequence with resolution bits 1; then, for FSDP, every parameter stored split (``fsdp_actions``) on
    what those left whole.

    Raises:
      ToastError: ``check_strategy``'s and ``placed_axes``' errors; ``roles`` name no argument dim of the
        program, or a role the strategy uses names none.
      InvalidState: an action gives an invalid state (a dim not divisible by its devices).
    """
    check_strategy(name, roles=roles, mesh=model.mesh)
    strategy = expert_strategy(name)
    analysis = model.analysis
    if not any(_argument_dims(analysis, pattern, dim) for pairs in roles.dims.values() for pattern, dim in pairs):
        raise ToastError(f"{roles.source}: no entry names an argument dim of {analysis.program.name} "
                         f"({_some_arguments(analysis)})")
    axes = placed_axes(strategy, model.mesh, roles)
    ones = (1,) * analysis.conflicts.resolution_bits  # the sequence: Figure 5b's sharding in every attention
    planned = [(role, Action(c, axis, ones) if role == "sequence" else Action(c, axis))
               for role, _ in strategy.placements if role in axes
               for c in role_colors(analysis, roles, role) for axis in axes[role]]
    state = _apply_planned(model, planned)
    actions: list[Action | ShardNodes] = [action for _, action in planned]
    if "params" in axes:  # after the color actions: on what they left whole
        parameters = fsdp_actions(model, axes["params"], state=state, data_axes=axes["batch"])
        state = _apply_nodes(model, state, parameters)
        actions += parameters
    return state, tuple(actions)


def _apply_planned(model: ShardingModel, planned: Sequence[tuple[str, Action]]) -> ShardingState:
    """The initial state after each of a strategy's ``(role, action)``s in turn. Without manual regions a state
    is valid when a state with more axes is (``ShardingModel.has_manual_regions``), so the end state alone is
    checked (a check per action was most of pricing a strategy on a big program); where it is invalid, or there
    are manual regions, each state in turn, and the first action at fault is named in the roles' terms.

    Raises:
      InvalidState: an action gives an invalid state.
    """
    initial = model.initial()
    if not model.has_manual_regions:
        state = initial
        for _, action in planned:
            state = model.apply(state, action, check=False)
        if not model.problem(state):
            return state
    state = initial
    roles_on: dict[str, list[str]] = {}  # mesh axis -> the roles placed on it so far
    for role, action in planned:
        following = model.apply(state, action, check=False)
        problem = model.problem(following)
        if problem:  # in the user's terms: the roles, not the analysis's colors
            others = sorted({r for r in roles_on.get(action.axis, []) if r != role})
            both = f" (roles {', '.join(others)} and {role} all want {action.axis})" if others else ""
            raise InvalidState(f"role '{role}' on {action.axis}: {problem}{both}")
        state = following
        roles_on.setdefault(action.axis, []).append(role)
    return state

def _apply_nodes(model: ShardingModel, state: ShardingState, actions: Sequence[ShardNodes]) -> ShardingState:
    """``apply_any`` of each of ``actions`` in turn, the state checked once at the end (a check reads every
    name: once per action was most of pricing an FSDP strategy on a big program); where the end state is
    invalid, the actions are applied again one at a time, so that the first one at fault is named."""
    masks = state.masks.copy()
    nodes_on: dict[str, list[int]] = {}  # axis -> the nodes its actions shard: one lookup of names per axis
    for action in actions:
        nodes_on.setdefault(action.axis, []).extend(action.nodes)
    for axis, nodes in nodes_on.items():
        masks[model.names_of_nodes(nodes)] |= np.uint8(1 << model.mesh.index(axis))
    result = ShardingState(model.mesh, masks, state.actions)
    if model.problem(result):
        for action in actions:
            state = apply_any(model, state, action)  # raises at the first action at fault
    return result


def apply_any(model: ShardingModel, state: ShardingState, action: Action | ShardNodes) -> ShardingState:
    """Apply a color action or a node action."""
    if isinstance(action, Action):
        return model.apply(state, action)
    names = model.names_of_nodes(action.nodes)
    masks = state.masks.copy()
    masks[names] |= np.uint8(1 << model.mesh.index(action.axis))
    result = ShardingState(model.mesh, masks, state.actions)
    problem = model.problem(result)
    if problem:
        raise InvalidState(f"{action.label} along {action.axis}: {problem}")
    return result


@dataclass(frozen=True, slots=True)
class UpdateChain:
    """How a parameter is updated: the values of its update chain and where the new value is returned.

    Attributes:
      values: the elementwise values of the parameter's shape from it to a returned result and, backwards
        from them, the elementwise producers of their other operands (the scaled gradient), the parameter
        excluded; empty when no update of it is returned (an inference program's weight).
      returns: ``(op id, operand)`` of ``@main``'s ``func.return`` uses of the chain's returned values.
    """

    values: tuple[int, ...]
    returns: tuple[tuple[int, int], ...]


# The last analysis's chains: the search's space, its cost model and every FSDP strategy ask for them.
_LAST_CHAINS: list[tuple[Analysis, Mapping[int, UpdateChain]]] = []


def update_chains(analysis: Analysis) -> Mapping[int, UpdateChain]:
    """The update chain of every floating-point argument with dims (argument value id -> chain), from the
    rules' elementwise table (rules/ops/elementwise.dl). Storing a parameter split along an axis (ZeRO-3)
    splits its chain alike, so its gradient arrives by reduce-scatter and its update runs split."""
    if _LAST_CHAINS and _LAST_CHAINS[0][0] is analysis:
        return _LAST_CHAINS[0][1]
    chains = MappingProxyType(_update_chains(analysis))
    _LAST_CHAINS[:] = [(analysis, chains)]
    return chains


def _update_chains(analysis: Analysis) -> dict[int, UpdateChain]:
    program = analysis.program
    users: dict[int, list[tuple[int, int]]] = {}
    for op in program.ops:
        for index, value_id in enumerate(op.operands):
            users.setdefault(value_id, []).append((op.id, index))
    returned = set(program.results)
    elementwise = analysis.elementwise_ops
    chains = {}
    for value_id in program.arguments:
        value = program.values[value_id]
        if not value.dtype.startswith(("f", "bf")) or not value.shape:
            continue
        frontier, seen = [value_id], {value_id}
        while frontier:
            current = frontier.pop()
            nearby = [program.ops[op_id] for op_id, _ in users.get(current, ())]
            if program.producer[current] >= 0:
                nearby.append(program.ops[program.producer[current]])
            for op in nearby:
                if op.id not in elementwise or len(op.results) != 1:
                    continue
                for candidate in (op.results[0], *op.operands):
                    if program.values[candidate].shape == value.shape and candidate not in seen and (
                            candidate == op.results[0] or program.producer[candidate] >= 0
                            and program.producer[candidate] in elementwise):
                        seen.add(candidate)
                        frontier.append(candidate)
        if not seen & returned:
            chains[value_id] = UpdateChain((), ())
            continue
        returns = tuple(sorted(
            (op_id, index) for chain_value in seen & returned for op_id, index in users.get(chain_value, ())
            if program.ops[op_id].kind == "func.return" and program.ops[op_id].parent is None))
        chains[value_id] = UpdateChain(tuple(sorted(seen - {value_id})), returns)
    return chains


def stored_nodes(analysis: Analysis, value_id: int, dim: int, chain: UpdateChain) -> set[int]:
    """The dimension-graph nodes that storing argument ``value_id`` split on ``dim`` shards: its own dim,
    its update chain's, the returned new value's, and where they are carried through loops (the layer-stacked
    parameter of a scan, its slice per iteration, its gradient's accumulator: ``toast.sharding.carry``)."""
    own, nodes = _chain_nodes(analysis, value_id, dim, chain)
    # Through loops: the carried stack, each iteration's slice, the gradient accumulator (toast.sharding.carry).
    carried = carried_nodes(analysis, forward_from=own, backward_from=nodes)
    return own | nodes | carried


def _chain_nodes(analysis: Analysis, value_id: int, dim: int, chain: UpdateChain) -> tuple[set[int], set[int]]:
    """The node of argument ``value_id``'s dim ``dim``, and its update chain's and returned new value's nodes."""
    names, node_of = analysis.names, analysis.node_of
    own = {int(node_of[names.def_base[value_id] + dim])}
    nodes = {int(node_of[names.def_base[v] + dim]) for v in chain.values}
    nodes.update(int(node_of[names.use_name(op_id, index, dim)]) for op_id, index in chain.returns)
    return own, nodes


# The last analysis's ``parameter_nodes`` answers by (argument value id, dim): the search's stored actions ask for
# every parameter dim, and each FSDP strategy again for one dim of every parameter.
_LAST_STORED: list[tuple[Analysis, dict[tuple[int, int], tuple[int, ...]]]] = []


def parameter_nodes(analysis: Analysis, value_id: int, dim: int) -> tuple[int, ...]:
    """``stored_nodes`` of argument ``value_id`` (a key of ``update_chains``) split on ``dim``, with its update
    chain, ascending; each answer is kept for the analysis (``store_parameter_nodes`` finds many at once)."""
    answers = _stored_answers(analysis)
    nodes = answers.get((value_id, dim))
    if nodes is None:
        nodes = answers[(value_id, dim)] = tuple(sorted(
            stored_nodes(analysis, value_id, dim, update_chains(analysis)[value_id])))
    return nodes


def store_parameter_nodes(analysis: Analysis, pairs: Sequence[tuple[int, int]]) -> None:
    """Find ``parameter_nodes`` of every ``(argument value id, dim)`` of ``pairs`` not asked before, their walks
    through loops taken together (``toast.sharding.carry.carried_nodes_many``)."""
    answers = _stored_answers(analysis)
    missing = [pair for pair in dict.fromkeys(pairs) if pair not in answers]
    if not missing:
        return
    chains = update_chains(analysis)
    starts = [_chain_nodes(analysis, value_id, dim, chains[value_id]) for value_id, dim in missing]
    for pair, (own, nodes), carried in zip(missing, starts, carried_nodes_many(analysis, starts), strict=True):
        answers[pair] = tuple(sorted(own | nodes | carried))


def _stored_answers(analysis: Analysis) -> dict[tuple[int, int], tuple[int, ...]]:
    if not (_LAST_STORED and _LAST_STORED[0][0] is analysis):
        _LAST_STORED[:] = [(analysis, {})]
    return _LAST_STORED[0][1]


def fsdp_actions(model: ShardingModel, axis: str | Sequence[str], *, state: ShardingState,
                 data_axes: Sequence[str] = ()) -> list[ShardNodes]:
    """Node actions storing every parameter split (ZeRO-3 on ``axis``, or on several axes: one dim split over
    all of them, major to minor, one action per axis): a floating-point argument that ``state`` leaves unsplit
    along ``data_axes`` (default: the storage axes; the inputs the batch role splits are data, not
    parameters), stored split on its largest dim that ``state`` leaves whole and the axes divide; where no dim
    is divisible by every axis, over as many of the leading ones as divide one. An axis that already splits the
    parameter (a Megatron-split weight) is left out for it."""
    analysis = model.analysis
    program, names = analysis.program, analysis.names
    mesh = model.mesh
    axes = (axis,) if isinstance(axis, str) else tuple(axis)
    data_bits = sum(1 << mesh.index(a) for a in (data_axes or axes))
    chosen = []  # (argument, its dim, the axes storing it, label)
    for value_id, chain in update_chains(analysis).items():
        value = program.values[value_id]
        base = names.def_base[value_id]
        masks = state.masks[base:base + len(value.shape)]
        if (masks & data_bits).any():
            continue  # data the batch role shards, not a parameter
        free = [a for a in axes if not (masks & (1 << mesh.index(a))).any()]
        for count in range(len(free), 0, -1):
            size = math.prod(mesh.size(a) for a in free[:count])
            dims = [d for d in sorted(range(len(value.shape)), key=lambda d: -value.shape[d])
                    if value.shape[d] % size == 0 and not masks[d]]
            if dims:
                break
        else:
            continue
        label = f"{value.name}:{dims[0]}" + (" and its update" if chain.returns else "")
        chosen.append((value_id, dims[0], free[:count], label))
    store_parameter_nodes(analysis, [(value_id, dim) for value_id, dim, _, _ in chosen])
    return [ShardNodes(parameter_nodes(analysis, value_id, dim), a, label)
            for value_id, dim, stored_on, label in chosen for a in stored_on]

