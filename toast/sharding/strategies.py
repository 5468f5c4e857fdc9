"""Classic expert strategies expressed as actions on the sharding state (the search's baselines).

A strategy is built from *roles*: the dims of named function arguments that play a part in
the model (the batch dim of the tokens, the heads dim of the attention weights, ...). A role
names colors, so the strategies need no knowledge of the program beyond argument names:

- ``data_parallel``: the batch color along the first mesh axis.
- ``megatron``: data parallel, plus the attention heads and the MLP hidden colors along the
  second axis (Megatron-LM tensor parallelism; Figure 2c for the MLP).
- ``fsdp``: data parallel, plus every parameter stored sharded along the first axis on its
  largest divisible dim (ZeRO-3): gathered where it is used, its update chain (the
  elementwise ops from the parameter to the new parameter returned) sharded alike, so the
  gradient arrives by reduce-scatter.
- ``sequence``: data parallel, plus the sequence color along the second axis with resolution
  bits ``1`` (the sequence sharding of Figure 5b in every attention).

Roles of the bundled models are in ``ROLES``; other programs pass their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from toast.analysis.named_dimensions import Analysis
from toast.errors import ToastError
from toast.sharding.state import Action, ShardingModel, ShardingState

# Role -> (argument name pattern, dim) pairs, per bundled model (module:function spec prefix).
ROLES: dict[str, dict[str, tuple[tuple[str, int], ...]]] = {
    "toast.examples.mlp:mlp": {"batch": (("x", 0),), "mlp": (("w1", 1),)},
    "toast.examples.attention:attention": {"sequence": (("x", 0),), "heads": (("wq", 1), ("wv", 1))},
    "toast.examples.gpt:": {
        "batch": (("tokens", 0),),
        "sequence": (("tokens", 1),),
        "heads": (("params['blocks'][*]['wq']", 1), ("params['blocks'][*]['wv']", 1)),
        "mlp": (("params['blocks'][*]['w_fc']", 1),),
        "parameters": (("params*", -1),),
    },
}
STRATEGIES = ("data_parallel", "megatron", "fsdp", "sequence")
ELEMENTWISE_UPDATE = {"stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
                      "stablehlo.negate", "stablehlo.sqrt", "stablehlo.rsqrt", "stablehlo.convert",
                      "stablehlo.maximum", "stablehlo.minimum", "stablehlo.select"}


@dataclass(frozen=True, slots=True)
class ShardNodes:
    """A manual action: shard these dimension-graph nodes (I-classes) along ``axis``.

    ``label`` says what they are (``"params['wte']:0 update chain"``)."""

    nodes: tuple[int, ...]
    axis: str
    label: str


def roles_for(source: str) -> dict[str, tuple[tuple[str, int], ...]]:
    """The roles of a bundled model named by its ``module:function`` spec (prefix match)."""
    for prefix, roles in ROLES.items():
        if source.startswith(prefix):
            return roles
    raise ToastError(f"{source}: no roles known for manual strategies (bundled: {', '.join(ROLES)})")


def role_colors(analysis: Analysis, roles: Mapping[str, Sequence[tuple[str, int]]], role: str) -> list[int]:
    """Colors of the argument dims a role names (sorted, distinct)."""
    colors = set()
    for pattern, dim in roles.get(role, ()):
        for value_id in analysis.program.arguments:
            value = analysis.program.values[value_id]
            if _matches(pattern, value.name) and 0 <= dim < len(value.shape):
                colors.add(int(analysis.color_of[analysis.names.def_base[value_id] + dim]))
    if not colors:
        raise ToastError(f"role '{role}' names no argument dim of {analysis.program.name}")
    return sorted(colors)


def _matches(pattern: str, name: str) -> bool:
    """Glob match where only ``*`` is special (argument names contain brackets)."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), name) is not None


def manual_strategy(model: ShardingModel, name: str, roles: Mapping[str, Sequence[tuple[str, int]]]
                    ) -> tuple[ShardingState, tuple[Action | ShardNodes, ...]]:
    """Apply the named strategy on ``model``'s mesh; returns the state and its actions."""
    if name not in STRATEGIES:
        raise ToastError(f"unknown strategy '{name}' (known: {', '.join(STRATEGIES)})")
    mesh = model.mesh
    first = mesh.names[0]
    second = mesh.names[1] if len(mesh.names) > 1 else None
    if name in ("megatron", "sequence") and second is None:
        raise ToastError(f"strategy '{name}' needs a mesh with two axes, e.g. batch=4,model=2")
    analysis = model.analysis
    actions: list[Action | ShardNodes] = []
    if "batch" in roles:
        actions += [Action(c, first) for c in role_colors(analysis, roles, "batch")]
    if name == "megatron":
        actions += [Action(c, second) for role in ("heads", "mlp") if role in roles
                    for c in role_colors(analysis, roles, role)]
    elif name == "sequence":
        ones = (1,) * analysis.conflicts.resolution_bits
        actions += [Action(c, second, ones) for c in role_colors(analysis, roles, "sequence")]
    elif name == "fsdp":
        actions += fsdp_actions(model, first)
    state = model.initial()
    for action in actions:
        state = apply_any(model, state, action)
    return state, tuple(actions)


def apply_any(model: ShardingModel, state: ShardingState, action: Action | ShardNodes) -> ShardingState:
    """Apply a color action or a node action."""
    if isinstance(action, Action):
        return model.apply(state, action)
    names = np.flatnonzero(np.isin(model.analysis.node_of, np.asarray(action.nodes, dtype=np.int64)))
    masks = state.masks.copy()
    masks[names] |= np.uint8(1 << model.mesh.index(action.axis))
    result = ShardingState(model.mesh, masks, state.actions)
    problem = model.problem(result)
    if problem:
        from toast.sharding.state import InvalidState

        raise InvalidState(f"{action.label} along {action.axis}: {problem}")
    return result


def fsdp_actions(model: ShardingModel, axis: str) -> list[ShardNodes]:
    """One node action per floating-point parameter argument (ZeRO-3 on ``axis``)."""
    analysis = model.analysis
    program, names = analysis.program, analysis.names
    size = model.mesh.size(axis)
    users: dict[int, list[tuple[int, int]]] = {}
    for op in program.ops:
        for index, value_id in enumerate(op.operands):
            users.setdefault(value_id, []).append((op.id, index))
    returned = set(program.results)
    actions = []
    for value_id in program.arguments:
        value = program.values[value_id]
        if not value.dtype.startswith(("f", "bf")) or not value.shape:
            continue
        dims = [d for d in sorted(range(len(value.shape)), key=lambda d: -value.shape[d]) if value.shape[d] % size == 0]
        if not dims:
            continue
        dim = dims[0]
        nodes = {int(analysis.node_of[names.def_base[value_id] + dim])}
        # The update chain: elementwise ops of the same shape from the parameter to a result,
        # and, backwards from them, the elementwise producers of their other operands (the
        # scaled gradient), so the gradient's reduction can be a reduce-scatter.
        frontier, seen = [value_id], {value_id}
        while frontier:
            current = frontier.pop()
            nearby = [program.ops[op_id] for op_id, _ in users.get(current, ())]
            if program.producer[current] >= 0:
                nearby.append(program.ops[program.producer[current]])
            for op in nearby:
                if op.kind not in ELEMENTWISE_UPDATE or len(op.results) != 1:
                    continue
                for candidate in (op.results[0], *op.operands):
                    if program.values[candidate].shape == value.shape and candidate not in seen and (
                            candidate == op.results[0] or program.producer[candidate] >= 0
                            and program.ops[program.producer[candidate]].kind in ELEMENTWISE_UPDATE):
                        seen.add(candidate)
                        frontier.append(candidate)
        if not seen & returned:
            nodes_label = f"{value.name}:{dim}"
            actions.append(ShardNodes(tuple(sorted(nodes)), axis, nodes_label))
            continue
        for chain_value in seen - {value_id}:
            base = names.def_base[chain_value]
            nodes.add(int(analysis.node_of[base + dim]))
        # The program returns the new parameter sharded too (its use by the final return).
        for chain_value in seen & returned:
            for op_id, index in users.get(chain_value, ()):
                if program.ops[op_id].kind == "func.return" and program.ops[op_id].parent is None:
                    nodes.add(int(analysis.node_of[names.use_name(op_id, index, dim)]))
        actions.append(ShardNodes(tuple(sorted(nodes)), axis, f"{value.name}:{dim} and its update"))
    return actions
