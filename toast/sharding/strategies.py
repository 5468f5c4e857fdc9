"""Classic expert strategies expressed as actions on the sharding state (the search's baselines).

A strategy is built from *roles* (``toast.sharding.roles``): the dims of named function
arguments that play a part in the model (the batch dim of the tokens, the heads dim of the
attention weights, ...). A role names colors, so the strategies need no knowledge of the
program beyond argument names; ``NEEDS`` says which roles each one needs.

- ``data_parallel``: the batch color along the data axis.
- ``megatron``: data parallel, plus the attention heads and the MLP hidden colors along the
  model axis (Megatron-LM tensor parallelism; Figure 2c for the MLP).
- ``fsdp``: data parallel, plus every parameter (a floating-point argument the batch role
  leaves unsharded) stored sharded along the data axis on its largest divisible dim
  (ZeRO-3): gathered where it is used, its update chain (the elementwise ops from the
  parameter to the new parameter returned) sharded alike, so the gradient arrives by
  reduce-scatter.
- ``sequence``: data parallel, plus the sequence color along the model axis with resolution
  bits ``1`` (the sequence sharding of Figure 5b in every attention).
- Composites (``COMPOSITES``), as the paper's manual baselines combine them: ``fsdp+megatron``
  (the U-Net's), ``fsdp+megatron+sequence`` and its other pairs (the Transformers': the best
  of every combination). Megatron and sequence actions come first, each on its axis; FSDP then
  stores every parameter not split along the data axis sharded there on its largest dim still
  whole, so a Megatron-split weight is split along both axes.

Axes are chosen by name, as meshes are usually named: the data axis is the one named
``batch``, ``data`` or ``dp`` (else the first axis); the model axis is the one named
``model``, ``tensor``, ``tp`` or ``mp`` (for ``sequence`` also ``sequence``, ``seq``, ``sp``
or ``context``), else the first axis that is not the data axis. A roles file's ``[axes]`` table
(``Roles.axes``) says otherwise, role by role, and may name several axes: ``batch = ["data",
"fsdp"]`` puts the batch color on both (one action per axis, a dim split over ``data`` x ``fsdp``),
and ``params = ["fsdp"]`` stores FSDP's parameters over those axes (by default, the batch's); the
model axis is then the first one the batch does not use.
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
from toast.sharding.carry import carried_nodes
from toast.sharding.mesh import Mesh
from toast.sharding.roles import PROPOSED_SOURCE, Roles
from toast.sharding.state import Action, InvalidState, ShardingModel, ShardingState, ShardNodes

# Strategy -> the roles it needs: one role of each tuple.
NEEDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "data_parallel": (("batch",),),
    "megatron": (("batch",), ("heads", "mlp")),
    "fsdp": (("batch",),),
    "sequence": (("batch",), ("sequence",)),
}
STRATEGIES = tuple(NEEDS)
TWO_AXES = ("megatron", "sequence")
# Combinations of the strategies above (each includes data parallelism), in canonical order.
COMPOSITES = ("fsdp+megatron", "fsdp+sequence", "megatron+sequence", "fsdp+megatron+sequence")
_COMBINABLE = ("megatron", "sequence", "fsdp")  # data parallelism is in each
DATA_AXIS_NAMES = ("batch", "data", "dp")
MODEL_AXIS_NAMES = ("model", "tensor", "tp", "mp")
SEQUENCE_AXIS_NAMES = ("sequence", "seq", "sp", "context", *MODEL_AXIS_NAMES)


def check_strategy(name: str, *, roles: Roles | None, mesh: Mesh) -> None:
    """Fail early, before any analysis, when strategy ``name`` cannot run with ``roles`` on ``mesh``
    (``roles=None``: roles to be proposed from the analysis, so only the name and the mesh are checked).

    Raises:
      ToastError: one line: an unknown strategy, a one-axis mesh for a strategy that needs two,
        a role the strategy needs (``NEEDS``) that ``roles`` lack, or an ``[axes]`` entry naming an axis the
        mesh lacks.
    """
    parts = strategy_parts(name)
    if any(part in TWO_AXES for part in parts) and len(mesh.names) < 2:
        raise ToastError(f"strategy '{name}' needs a mesh with two axes, e.g. batch=4,model=2")
    if roles is None:
        return
    for key, axes in roles.axes.items():
        for axis in axes:
            if axis not in mesh.names:
                raise ToastError(f"{roles.source}: [axes] {key} names mesh axis '{axis}', which the mesh "
                                 f"{mesh.spec()} lacks")
    needs = dict.fromkeys(alternatives for part in parts for alternatives in NEEDS[part])
    for alternatives in needs:
        if not any(roles.get(role) for role in alternatives):
            wanted = " or ".join(f"'{role}'" for role in alternatives)
            where = "--roles FILE or --batch ARG:DIM" if alternatives == ("batch",) else "--roles FILE"
            given = ("; the roles proposed from the analysis lack it" if roles.source == PROPOSED_SOURCE
                     else f", which {roles.source} does not name" if roles.dims else f": {roles.source}")
            raise ToastError(f"strategy '{name}' needs role {wanted}{given}; give it in {where}")


def strategy_parts(name: str) -> tuple[str, ...]:
    """The strategies a name combines (``"fsdp+megatron"`` -> ``("fsdp", "megatron")``; a plain name is
    itself).

    Raises:
      ToastError: an unknown name or part, or a part given twice.
    """
    parts = tuple(part.strip() for part in name.split("+"))
    if len(parts) == 1 and parts[0] in NEEDS:
        return parts
    known = ", ".join(STRATEGIES + COMPOSITES)
    if len(parts) == 1 or any(part not in _COMBINABLE for part in parts) or len(set(parts)) < len(parts):
        raise ToastError(f"unknown strategy '{name}' (known: {known}; combine fsdp, megatron and sequence "
                         "with '+')")
    return parts


def role_colors(analysis: Analysis, roles: Roles, role: str) -> list[int]:
    """Colors of the argument dims ``role`` names (sorted, distinct); a one-line error naming the
    roles' source and some of the program's arguments when it names none."""
    colors = {int(analysis.color_of[name]) for pattern, dim in roles.get(role)
              for name in _argument_dims(analysis, pattern, dim)}
    if not colors:
        raise ToastError(f"{roles.source}: role '{role}' names no argument dim of {analysis.program.name} "
                         f"({_some_arguments(analysis)})")
    return sorted(colors)


def _argument_dims(analysis: Analysis, pattern: str, dim: int) -> list[int]:
    """Definition names of dim ``dim`` of the arguments whose name matches ``pattern``, a glob
    where only ``*`` is special (argument names contain brackets)."""
    program = analysis.program
    regex = re.compile(re.escape(pattern).replace(r"\*", ".*"))
    return [analysis.names.def_base[v] + dim for v in program.arguments
            if regex.fullmatch(program.values[v].name) and dim < len(program.values[v].shape)]


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


def _role_axes(model: ShardingModel, roles: Roles, role: str, preferred: tuple[str, ...],
               data_axes: Sequence[str]) -> tuple[str, ...]:
    """The mesh axes of a model role (heads, mlp, sequence): the roles' ``[axes]`` entry, else the model axis."""
    return roles.axes_of(role) or (_model_axis(model.mesh, preferred, data_axes=data_axes),)


def manual_strategy(model: ShardingModel, name: str, roles: Roles
                    ) -> tuple[ShardingState, tuple[Action | ShardNodes, ...]]:
    """Apply the named strategy on ``model``'s mesh; returns the state and its actions.

    Raises:
      ToastError: ``check_strategy``'s errors; ``roles`` name no argument dim of the program,
        or a role the strategy uses names none.
      InvalidState: an action gives an invalid state (a dim not divisible by its devices).
    """
    check_strategy(name, roles=roles, mesh=model.mesh)
    parts = strategy_parts(name)
    analysis = model.analysis
    if not any(_argument_dims(analysis, pattern, dim) for pairs in roles.dims.values() for pattern, dim in pairs):
        raise ToastError(f"{roles.source}: no entry names an argument dim of {analysis.program.name} "
                         f"({_some_arguments(analysis)})")
    batch_axes = roles.axes_of("batch") or (_data_axis(model.mesh),)
    planned: list[tuple[str, Action]] = [("batch", Action(c, axis)) for c in role_colors(analysis, roles, "batch")
                                         for axis in batch_axes]
    for part, colors_on_second_axis in _SECOND_AXIS.items():  # a composite: its parts' actions, in this order
        if part in parts:
            planned += colors_on_second_axis(model, roles, batch_axes)
    state = model.initial()
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
    actions: list[Action | ShardNodes] = [action for _, action in planned]
    for part, stored in _STORED_ON_DATA_AXIS.items():  # after the color actions: on what they left whole
        if part in parts:
            parameters = stored(model, roles.axes_of("params") or batch_axes, state=state, data_axes=batch_axes)
            state = _apply_nodes(model, state, parameters)
            actions += parameters
    return state, tuple(actions)


def _megatron(model: ShardingModel, roles: Roles, data_axes: Sequence[str]) -> list[tuple[str, Action]]:
    """The heads and MLP hidden colors along the model axis (Megatron-LM's tensor parallelism)."""
    return [(role, Action(c, axis)) for role in ("heads", "mlp") if roles.get(role)
            for c in role_colors(model.analysis, roles, role)
            for axis in _role_axes(model, roles, role, MODEL_AXIS_NAMES, data_axes)]


def _sequence(model: ShardingModel, roles: Roles, data_axes: Sequence[str]) -> list[tuple[str, Action]]:
    """The sequence color along the model (sequence) axis, resolution bits 1 (Figure 5b's sharding)."""
    axes = _role_axes(model, roles, "sequence", SEQUENCE_AXIS_NAMES, data_axes)
    ones = (1,) * model.analysis.conflicts.resolution_bits
    return [("sequence", Action(c, axis, ones)) for c in role_colors(model.analysis, roles, "sequence")
            for axis in axes]


def _apply_nodes(model: ShardingModel, state: ShardingState, actions: Sequence[ShardNodes]) -> ShardingState:
    """``apply_any`` of each of ``actions`` in turn, the state checked once at the end (a check reads every
    name: once per action was most of pricing an FSDP strategy on a big program); where the end state is
    invalid, the actions are applied again one at a time, so that the first one at fault is named."""
    masks = state.masks.copy()
    for action in actions:
        masks[model.names_of_nodes(action.nodes)] |= np.uint8(1 << model.mesh.index(action.axis))
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
    names = analysis.names
    own = {int(analysis.node_of[names.def_base[value_id] + dim])}
    nodes = {int(analysis.node_of[names.def_base[v] + dim]) for v in chain.values}
    nodes.update(int(analysis.node_of[names.use_name(op_id, index, dim)]) for op_id, index in chain.returns)
    # Through loops: the carried stack, each iteration's slice, the gradient accumulator (toast.sharding.carry).
    carried = carried_nodes(analysis, forward_from=own, backward_from=nodes)
    return own | nodes | carried


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
    actions = []
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
        nodes = tuple(sorted(stored_nodes(analysis, value_id, dims[0], chain)))
        label = f"{value.name}:{dims[0]}" + (" and its update" if chain.returns else "")
        actions += [ShardNodes(nodes, a, label) for a in free[:count]]
    return actions


# The strategies as tables, composites as compositions of their parts (``data_parallel`` is in each, first):
# a part's (role, color action) pairs on the second mesh axis, in this order; then a part that stores every
# parameter sharded along the data axis (``fsdp``), on what the color actions left whole.
_SECOND_AXIS = {"megatron": _megatron, "sequence": _sequence}
_STORED_ON_DATA_AXIS = {"fsdp": fsdp_actions}
