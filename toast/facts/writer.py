"""``toast.frontend.ir.Program`` -> Datalog facts (the relations of ``toast.facts.schema.INPUTS``).

Dimension names and uses are numbered once, by ``toast.facts.numbering``; this module writes
that numbering as ``def_dim``, ``operand`` and ``use_dim`` facts. Attributes are decoded into
the per-op relations the rules join on; where an attribute needs arithmetic that Datalog says
badly (positions of dot_general free dims, the gcd factorization of a reshape), it is done
here and the result is a plain fact.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterator

import numpy as np

from toast.errors import InputError
from toast.facts.numbering import DimensionNames, number_names
from toast.facts.schema import INPUTS
from toast.frontend.ir import TERMINATORS, Op, Program

Facts = dict[str, list[tuple]]


def program_facts(program: Program) -> tuple[Facts, DimensionNames]:
    """All input facts for ``program`` and the meaning of every dimension name."""
    names = number_names(program)
    facts: Facts = {relation.name: [] for relation in INPUTS}
    # Column by column, in C loops (a 100k-op program has half a million names): a name's rows in name order.
    def_count, values = len(names.defs), program.values
    def_values, def_dims = zip(*names.defs, strict=True) if names.defs else ((), ())
    sizes = itertools.chain.from_iterable(map(_SHAPE, values))
    facts["def_dim"] = list(zip(range(def_count), def_values, def_dims, sizes, strict=True))
    sites = names.use_sites
    site_ops, site_operands, used, _ = zip(*sites, strict=True) if sites else ((), (), (), ())
    facts["operand"] = list(zip(site_ops, site_operands, range(len(sites)), used, strict=True))
    use_ranks = np.fromiter((len(values[value].shape) for value in used), dtype=np.int64, count=len(used))
    use_ids = np.repeat(np.arange(len(sites), dtype=np.int64), use_ranks).tolist()
    facts["use_dim"] = list(zip(range(def_count, def_count + len(names.uses)), use_ids, map(_DIM, names.uses),
                                strict=True))
    facts["op"] = [(op.id, op.kind) for op in program.ops]
    results, block_args, region_returns = facts["result"], facts["block_arg"], facts["region_return"]
    for op in program.ops:
        op_id = op.id
        for index, value_id in enumerate(op.results):
            results.append((op_id, index, value_id))
        if op.regions:
            for region, args in enumerate(op.regions):
                for index, value_id in enumerate(args):
                    block_args.append((op_id, region, index, value_id))
        if op.parent is not None and op.kind in TERMINATORS:
            region_returns.append((op.parent[0], op.parent[1], op_id))
        if op.kind.removeprefix("stablehlo.") not in _ATTRIBUTE_KINDS:
            continue  # most ops: no attribute facts
        try:
            for relation, row in _attribute_facts(op, program):
                facts[relation].append(row)
        except (ValueError, KeyError, IndexError) as err:  # zip(strict=True), missing or short attributes
            raise InputError(f"{op.loc or program.name}: {op.kind} has malformed attributes ({err})") from None
    return facts, names


_SHAPE, _DIM = operator.attrgetter("shape"), operator.itemgetter(2)  # a value's shape, a use name's dim


def _shape(program: Program, op: Op, operand: int) -> tuple[int, ...]:
    return program.values[op.operands[operand]].shape


# The kinds (``stablehlo.`` removed) ``_attribute_facts`` writes rows for.
_ATTRIBUTE_KINDS = frozenset({
    "custom_call", "dot_general", "transpose", "broadcast_in_dim", "reduce", "reshape", "concatenate", "reverse",
    "sort", "pad", "reduce_window", "select_and_scatter", "convolution", "gather", "scatter", "sdy.sharding_group",
    "iota", "compare", "constant"})
# A Datalog number is 32-bit: an integer constant outside that range is written as no fact.
_NUMBER_RANGE = range(-(2**31), 2**31)


def _attribute_facts(op: Op, program: Program) -> Iterator[tuple[str, tuple]]:
    kind = op.kind.removeprefix("stablehlo.")
    if kind == "custom_call":
        yield "custom_call_target", (op.id, str(op.attr("call_target_name", "")))
        kernel = op.attr("kernel")
        if kernel:
            yield "custom_call_kernel", (op.id, str(kernel))
        estimate = op.attr("kernel_cost_estimate")
        if estimate is not None:
            flops, bytes_accessed, transcendentals = estimate
            yield "kernel_cost_estimate", (op.id, str(flops), str(bytes_accessed), str(transcendentals))
        for key, value in op.attr("kernel_config", ()):
            yield "kernel_config", (op.id, key, value)
    elif kind == "dot_general":
        yield from _dot_general(op, program)
    elif kind == "transpose":
        for out_dim, in_dim in enumerate(op.attr("permutation", ())):
            yield "transpose_perm", (op.id, out_dim, in_dim)
    elif kind == "broadcast_in_dim":
        for in_dim, out_dim in enumerate(op.attr("broadcast_dimensions", ())):
            yield "broadcast_map", (op.id, in_dim, out_dim)
    elif kind == "reduce":
        reduced = set(op.attr("dimensions", ()))
        kept = [d for d in range(len(_shape(program, op, 0))) if d not in reduced]
        for out_dim, in_dim in enumerate(kept):
            yield "reduce_keep", (op.id, in_dim, out_dim)
    elif kind == "reshape":
        in_shape = _shape(program, op, 0)
        out_shape = program.values[op.results[0]].shape
        for in_dim, out_dim, size, whole in reshape_factors(in_shape, out_shape):
            yield "reshape_factor", (op.id, in_dim, out_dim, size, int(whole))
    elif kind == "concatenate":
        yield "concat_dim", (op.id, op.attr("dimension", 0))
    elif kind == "reverse":
        for dim in op.attr("dimensions", ()):
            yield "reverse_dim", (op.id, dim)
    elif kind == "sort":
        yield "sort_dim", (op.id, op.attr("dimension", -1) % max(1, len(_shape(program, op, 0))))
    elif kind == "pad":
        for dim, (low, high, interior) in enumerate(zip(
                op.attr("edge_padding_low", ()), op.attr("edge_padding_high", ()), op.attr("interior_padding", ()),
                strict=True)):
            yield "pad_dim", (op.id, dim, low, high, interior)
    elif kind in ("reduce_window", "select_and_scatter"):
        yield from _windows(op, program)
    elif kind == "convolution":
        yield from _convolution(op)
    elif kind == "gather":
        yield from _gather(op, program)
    elif kind == "scatter":
        yield from _scatter(op, program)
    elif kind == "sdy.sharding_group":
        yield "sharding_group", (op.id, dict(op.attrs)["group_id"])
    elif kind == "iota":
        yield "iota_dim", (op.id, op.attr("iota_dimension", 0))
    elif kind == "compare":
        yield "compare_direction", (op.id, str(op.attr("comparison_direction", "")))
    elif kind == "constant":
        scalar = op.attr("scalar")
        if scalar is not None and scalar in _NUMBER_RANGE:
            yield "integer_scalar", (op.id, scalar)


def _dot_general(op: Op, program: Program) -> Iterator[tuple[str, tuple]]:
    numbers = op.attr("dot_dimension_numbers", {})
    lhs_batch = numbers.get("lhs_batching_dimensions", ())
    rhs_batch = numbers.get("rhs_batching_dimensions", ())
    lhs_contract = numbers.get("lhs_contracting_dimensions", ())
    rhs_contract = numbers.get("rhs_contracting_dimensions", ())
    for out_dim, (lhs, rhs) in enumerate(zip(lhs_batch, rhs_batch, strict=True)):
        yield "dot_batch", (op.id, lhs, rhs, out_dim)
    for lhs, rhs in zip(lhs_contract, rhs_contract, strict=True):
        yield "dot_contract", (op.id, lhs, rhs)
    # Result dims: batch dims, then lhs free dims, then rhs free dims, each in order.
    out_dim = len(lhs_batch)
    for operand, (batch, contract) in enumerate(((lhs_batch, lhs_contract), (rhs_batch, rhs_contract))):
        for in_dim in range(len(_shape(program, op, operand))):
            if in_dim not in batch and in_dim not in contract:
                yield "dot_free", (op.id, operand, in_dim, out_dim)
                out_dim += 1


def _windows(op: Op, program: Program) -> Iterator[tuple[str, tuple]]:
    rank = len(_shape(program, op, 0))
    sizes = op.attr("window_dimensions", (1,) * rank)
    strides = op.attr("window_strides", (1,) * rank)
    padding = op.attr("padding", ())  # flattened [rank, 2] pairs
    base_dilations = op.attr("base_dilations", (1,) * rank)
    window_dilations = op.attr("window_dilations", (1,) * rank)
    for dim in range(rank):
        padded = (
            (len(padding) == 2 * rank and (padding[2 * dim] or padding[2 * dim + 1]))
            or base_dilations[dim] != 1 or window_dilations[dim] != 1
        )
        yield "window_dim", (op.id, dim, sizes[dim], strides[dim], int(bool(padded)))


def _convolution(op: Op) -> Iterator[tuple[str, tuple]]:
    numbers = op.attr("dimension_numbers", {})
    feature_groups = op.attr("feature_group_count", 1)
    batch_groups = op.attr("batch_group_count", 1)
    if batch_groups == 1:
        yield "conv_batch", (op.id, numbers["input_batch_dimension"], numbers["output_batch_dimension"])
    if feature_groups == 1:
        yield "conv_feature", (op.id, numbers["input_feature_dimension"], numbers["kernel_input_feature_dimension"])
    if feature_groups == 1 and batch_groups == 1:
        yield "conv_out_feature", (op.id, numbers["kernel_output_feature_dimension"],
                                   numbers["output_feature_dimension"])
    yield "conv_kernel_out_feature", (op.id, numbers["kernel_output_feature_dimension"])
    spatial = numbers["input_spatial_dimensions"]
    for lhs, rhs, out in zip(spatial, numbers["kernel_spatial_dimensions"],
                             numbers["output_spatial_dimensions"], strict=True):
        yield "conv_spatial", (op.id, lhs, rhs, out)
    rank = len(spatial)
    strides = op.attr("window_strides", (1,) * rank)
    padding = op.attr("padding", (0,) * (2 * rank))  # flattened [rank, 2] pairs
    dilations = zip(op.attr("lhs_dilation", (1,) * rank), op.attr("rhs_dilation", (1,) * rank),
                    op.attr("window_reversal", (0,) * rank), strict=True)
    for k, (lhs, stride, (lhs_dilation, rhs_dilation, reversal)) in enumerate(
            zip(spatial, strides, dilations, strict=True)):
        dilated = lhs_dilation != 1 or rhs_dilation != 1 or bool(reversal)
        yield "conv_window", (op.id, lhs, stride, padding[2 * k], padding[2 * k + 1], int(dilated))


def _batch_positions(rank: int, index_vector_dim: int) -> list[int]:
    """Indices dims that index the batch (all but ``index_vector_dim``), in order."""
    return [d for d in range(rank) if d != index_vector_dim]


def _gather(op: Op, program: Program) -> Iterator[tuple[str, tuple]]:
    numbers = op.attr("dimension_numbers", {})
    slice_sizes = op.attr("slice_sizes", ())
    operand_rank = len(_shape(program, op, 0))
    indices_rank = len(_shape(program, op, 1))
    out_rank = len(program.values[op.results[0]].shape)
    offset_dims = numbers.get("offset_dims", ())
    dropped = set(numbers.get("collapsed_slice_dims", ())) | set(numbers.get("operand_batching_dims", ()))
    window_operand_dims = [d for d in range(operand_rank) if d not in dropped]
    for operand_dim, out_dim in zip(window_operand_dims, offset_dims, strict=True):
        yield "gather_offset", (op.id, operand_dim, out_dim, slice_sizes[operand_dim])
    batch_out_dims = [d for d in range(out_rank) if d not in offset_dims]
    for indices_dim, out_dim in zip(_batch_positions(indices_rank, numbers.get("index_vector_dim", indices_rank)),
                                    batch_out_dims, strict=True):
        yield "gather_batch", (op.id, indices_dim, out_dim)
    for operand_dim, indices_dim in zip(numbers.get("operand_batching_dims", ()),
                                        numbers.get("start_indices_batching_dims", ()), strict=True):
        yield "gather_operand_batch", (op.id, operand_dim, indices_dim)
    vector_dim = numbers.get("index_vector_dim", indices_rank)
    for column, operand_dim in enumerate(numbers.get("start_index_map", ())):
        yield "gather_index_column", (op.id, vector_dim, column, operand_dim, slice_sizes[operand_dim])


def _scatter(op: Op, program: Program) -> Iterator[tuple[str, tuple]]:
    numbers = op.attr("scatter_dimension_numbers", {})
    count = len(op.results)
    yield "scatter_inputs", (op.id, count)
    input_rank = len(_shape(program, op, 0))
    indices_rank = len(_shape(program, op, count))
    update_rank = len(_shape(program, op, count + 1))
    window_dims = numbers.get("update_window_dims", ())
    dropped = set(numbers.get("inserted_window_dims", ())) | set(numbers.get("input_batching_dims", ()))
    window_input_dims = [d for d in range(input_rank) if d not in dropped]
    for input_dim, update_dim in zip(window_input_dims, window_dims, strict=True):
        yield "scatter_window", (op.id, input_dim, update_dim)
    scatter_update_dims = [d for d in range(update_rank) if d not in window_dims]
    for indices_dim, update_dim in zip(_batch_positions(indices_rank, numbers.get("index_vector_dim", indices_rank)),
                                       scatter_update_dims, strict=True):
        yield "scatter_index", (op.id, indices_dim, update_dim)
    for input_dim, indices_dim in zip(numbers.get("input_batching_dims", ()),
                                      numbers.get("scatter_indices_batching_dims", ()), strict=True):
        yield "scatter_input_batch", (op.id, input_dim, indices_dim)
    # The window an index starts along each input dim: 1 row where the dim is inserted (or a batching dim), else
    # the size of the update window dim written along it.
    update_shape = _shape(program, op, count + 1)
    window_sizes = {input_dim: update_shape[update_dim]
                    for input_dim, update_dim in zip(window_input_dims, window_dims, strict=True)}
    vector_dim = numbers.get("index_vector_dim", indices_rank)
    for column, input_dim in enumerate(numbers.get("scattered_dims_to_operand_dims", ())):
        yield "scatter_index_column", (op.id, vector_dim, column, input_dim, window_sizes.get(input_dim, 1))
    # The update computation is the region right after the op (children follow their parent): one combining op
    # and its return.
    body = [o.kind for o in program.ops[op.id + 1:op.id + 1 + 8]
            if o.parent == (op.id, 0) and o.kind not in TERMINATORS]
    if len(body) == 1:
        yield "scatter_combiner", (op.id, body[0])


def reshape_factors(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[tuple[int, int, int, bool]]:
    """Operand/result dims of a reshape that share their *major* factor.

    Row-major reshapes keep element order, so a dim boundary survives wherever the running
    products of the two shapes meet. At each such aligned point the next operand dim (size a)
    and the next result dim (size b) both start with a factor of ``gcd(a, b)``: sharding
    that factor on one side shards it on the other. Returns
    ``(in_dim, out_dim, factor_size, whole)`` rows, ``whole`` when a == b (the dim is kept).
    Size-1 dims are skipped (they hold no factor). E.g. ``[B,S,D] -> [B,S,H,Dh]`` gives
    ``(0,0,B,True), (1,1,S,True), (2,2,H,False)``: D is identified with H.
    """
    ins = [(d, s) for d, s in enumerate(in_shape) if s != 1]
    outs = [(d, s) for d, s in enumerate(out_shape) if s != 1]
    rows = []
    i = j = 0
    in_product = out_product = 1
    while i < len(ins) and j < len(outs):
        if in_product == out_product:
            (in_dim, a), (out_dim, b) = ins[i], outs[j]
            factor = math.gcd(a, b)
            if factor > 1:
                rows.append((in_dim, out_dim, factor, a == b))
        # Advance the side that is behind (both when aligned and the dims are equal).
        if in_product * ins[i][1] <= out_product * outs[j][1]:
            in_product *= ins[i][1]
            i += 1
        else:
            out_product *= outs[j][1]
            j += 1
    return rows
