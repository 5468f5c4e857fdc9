"""Roles proposed from the analysis, for a program that comes without a roles file.

The manual strategies (``toast.sharding.strategies``) need roles; a roles file is written by someone who
knows the model. Without one, these are read off the analysis, from what the colors do in the program
(the rules' summed dims and the colors of every operand and result dim), so the manual strategies are
still candidates for ``toast autoshard`` and rows of ``toast compare`` on any program:

- **parameters** are the floating-point arguments whose update is returned (``update_chains``: a training
  step's weights and optimizer moments); in a program that returns no update (inference) they are the
  floating-point arguments that are not data.
- **data** are the other arguments with dims: the integer arguments (tokens, labels, indices) and the
  floating-point inputs; in an inference program, the floating-point arguments whose dim 0 color reaches
  a result's dim 0 (the batch flows to the output; a weight's dims do not).
- **batch**: the color of dim 0 of the most data arguments, of those that name no parameter dim (ties: the
  color with the most names, in every activation); every data argument's dim 0 of that color.
- **sequence**: the color of dim 1 of an integer data argument of rank 2 or more (``tokens[B, S]``) when it
  is not the batch color.
- **heads**: colors that some contraction (an op with FLOPs, the rules' ``flop_name``: dot_general,
  convolution) carries unsummed in two operands and its result (attention's heads, a MoE's experts), that
  name a parameter dim and no data dim.
- **mlp**: colors a contraction sums over, that no other op sums (layer norms and softmaxes sum the model
  width and the vocabulary, an embedding's scatter-add its rows: Megatron splits none of them), that name
  a parameter dim and no data dim, and that share no contraction with a heads color (the per-head dim of
  ``q @ k``): the MLP hidden dims of every layer.

Each role names one parameter dim per color (the first argument, in program order, that has it): a role
shards colors, so one name per color says all, and the proposal stays short enough to read and edit
(``Roles.to_toml``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from toast.analysis.named_dimensions import Analysis
from toast.frontend.ir import Program
from toast.sharding.roles import PROPOSED_SOURCE, Roles
from toast.sharding.strategies import update_chains


def roles_or_proposed(roles: Roles | None, analysis: Analysis) -> Roles:
    """``roles`` where they name any dim; else (no roles file, an empty one, no ``--batch``) the roles
    ``propose_roles`` reads off ``analysis``."""
    return roles if roles is not None and roles.dims else propose_roles(analysis)


def propose_roles(analysis: Analysis) -> Roles:
    """Roles for ``analysis``'s program read off its colors (the module docstring says how).

    Returns:
      ``Roles`` with ``source`` ``PROPOSED_SOURCE``; a role is absent when nothing plays it (no data
      argument: no role at all).
    """
    program, names = analysis.program, analysis.names
    color_of = analysis.color_of
    arguments = [v for v in program.arguments if program.values[v].shape]

    def dim_color(value_id: int, dim: int) -> int:
        return int(color_of[names.def_base[value_id] + dim])

    floats = [v for v in arguments if program.values[v].dtype.startswith(("f", "bf"))]
    chains = update_chains(analysis)
    trained = [v for v in floats if chains.get(v) is not None and chains[v].returns]
    if trained:
        parameters = trained
    else:
        result_batch = {dim_color(v, 0) for v in program.results if program.values[v].shape}
        parameters = [v for v in floats if dim_color(v, 0) not in result_batch]
    parameter_set = set(parameters)
    data = [v for v in arguments if v not in parameter_set]
    parameter_colors = {dim_color(v, d): (v, d) for v in reversed(parameters)
                        for d in reversed(range(len(program.values[v].shape)))}  # first argument wins

    sizes = Counter(int(c) for c in color_of)
    leading = Counter(dim_color(v, 0) for v in data if dim_color(v, 0) not in parameter_colors)
    if not leading:
        return Roles({}, source=PROPOSED_SOURCE)
    batch_color = min(leading, key=lambda c: (-leading[c], -sizes[c], c))
    roles: dict[str, list[tuple[int, int]]] = {"batch": [(v, 0) for v in data if dim_color(v, 0) == batch_color]}
    data_colors = {dim_color(v, d) for v in data for d in range(len(program.values[v].shape))}

    tokens = [(v, 1) for v in data if not program.values[v].dtype.startswith(("f", "bf"))
              and len(program.values[v].shape) >= 2 and dim_color(v, 1) != batch_color]
    if tokens:
        roles["sequence"] = [tokens[0]]

    heads, summed, reduced, pairwise = _contraction_colors(analysis, batch_color)
    heads = (heads - data_colors) & parameter_colors.keys()
    mlp = (summed - reduced - pairwise - heads - data_colors) & parameter_colors.keys()
    # Megatron splits every chosen color along one axis: two in one tensor would put the axis on two of its dims.
    chosen = _apart(analysis, [sorted(heads, key=lambda c: (sizes[c], c)), sorted(mlp, key=lambda c: (sizes[c], c))])
    for role, colors in zip(("heads", "mlp"), chosen, strict=True):
        if colors:
            roles[role] = sorted(parameter_colors[c] for c in colors)
    return Roles({role: tuple((program.values[v].name, d) for v, d in sorted(pairs, key=_argument_order(program)))
                  for role, pairs in roles.items()}, source=PROPOSED_SOURCE)


def _argument_order(program: Program) -> Callable[[tuple[int, int]], tuple[int, int]]:
    """Sort key of ``(argument value id, dim)`` pairs: the arguments' order in the program, then the dim."""
    position = {v: index for index, v in enumerate(program.arguments)}
    return lambda pair: (position[pair[0]], pair[1])


def _contraction_colors(analysis: Analysis, batch_color: int) -> tuple[set[int], set[int], set[int], set[int]]:
    """``(carried, summed, reduced, pairwise)`` colors: carried unsummed through a contraction's two operands
    into its result; summed by a contraction (a color two operands have); summed by any other op (a
    reduction, a scatter-add); summed by a contraction of two operands that both have ``batch_color`` (two
    activations, as ``q @ k``: the per-head dim)."""
    program, names, color_of = analysis.program, analysis.names, analysis.color_of
    summed_by_op: dict[int, set[tuple[int, int]]] = {}
    for op_id, operand, dim in analysis.summed_dims:
        summed_by_op.setdefault(op_id, set()).add((operand, dim))
    carried: set[int] = set()
    summed: set[int] = set()
    reduced: set[int] = set()
    pairwise: set[int] = set()
    for op_id, sums in sorted(summed_by_op.items()):
        op = program.ops[op_id]
        operand_colors = [{int(color_of[names.use_name(op_id, index, d)])
                           for d in range(len(program.values[value_id].shape))}
                          for index, value_id in enumerate(op.operands)]
        summed_colors = {int(color_of[names.use_name(op_id, index, d)]) for index, d in sums}
        shared = {c for c in set().union(*operand_colors) if sum(c in colors for colors in operand_colors) >= 2}
        if op_id not in analysis.flop_names:
            reduced |= summed_colors  # a reduction, or a scatter-add: it sums, it multiplies nothing
            continue
        summed |= summed_colors & shared
        reduced |= summed_colors - shared
        if sum(batch_color in colors for colors in operand_colors) >= 2:
            pairwise |= summed_colors & shared
        result_colors = {int(color_of[names.def_base[r] + d]) for r in op.results
                         for d in range(len(program.values[r].shape))}
        carried |= (shared - summed_colors) & result_colors
    return carried, summed, reduced, pairwise


def _apart(analysis: Analysis, groups: list[list[int]]) -> list[list[int]]:
    """Each group's colors, in order, keeping a color only when no value of the program has a dim of it and
    a dim of a color kept before (in this group or an earlier one)."""
    program, names, color_of = analysis.program, analysis.names, analysis.color_of
    wanted = {c for group in groups for c in group}
    together: dict[int, set[int]] = {c: set() for c in wanted}
    for value_id, value in enumerate(program.values):
        base = names.def_base[value_id]
        colors = {int(color_of[base + d]) for d in range(len(value.shape))} & wanted
        for c in colors:
            together[c] |= colors - {c}
    kept: set[int] = set()
    result = []
    for group in groups:
        chosen = []
        for color in group:
            if not together[color] & kept:
                chosen.append(color)
                kept.add(color)
        result.append(chosen)
    return result
