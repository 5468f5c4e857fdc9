"""The input StableHLO annotated with a sharding state, in the Shardy form XLA partitions.

The module is the program's own text (``Program.text``), re-read with the MLIR bindings and
annotated the way ``jax.jit(f, in_shardings=..., out_shardings=...)`` annotates it in jax 0.10:

- ``sdy.mesh @mesh = <["batch"=4, "model"=2]>`` at the top of the module;
- ``sdy.sharding = #sdy.sharding<@mesh, [{"batch"}, {}]>`` on ``@main``'s arguments (their
  definition sharding) and results (the sharding ``func.return`` uses them with);
- ``sdy.sharding_constraint`` after every op of ``@main``, its nested regions and the functions
  it calls, on every ranked result, with the definition sharding (after a reduce-scatter where the communication
  model puts one), and before an op on every operand it uses sharded unlike the definition
  (the use sharding: where the model gathers, all-to-alls or slices), so that XLA's
  partitioner carries out the state's plan instead of choosing its own. Dim shardings are
  closed (``{"batch"}``, not ``{"batch", ?}``): exactly these axes.

Ops inside private functions that ``func.call`` reaches (JAX's ``@_take``, ``@relu``) are
constrained like ``@main``'s: the analysis inlines each call (``toast.frontend.stablehlo``), so
each call site has its own state, and a function called from several sites is first cloned, one
private function per call (``@_where``, ``@_where_1``, ...), so that every op of the module stands
for exactly one op of the program. Left unconstrained, XLA's partitioner would shard a callee's
ops its own way (an fsdp-split embedding table gathered by all-to-all inside ``@_take``, not
all-gathered before it as the plan has it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toast.cost.collectives import CommunicationModel
from toast.errors import ToastError
from toast.sharding.state import ShardingModel, ShardingState

MESH_NAME = "mesh"
_UNCONSTRAINED = frozenset({"func.return", "stablehlo.return", "sdy.return"})


def sharded_module_text(model: ShardingModel, state: ShardingState, *,
                        communication: CommunicationModel | None = None, constraints: bool = True) -> str:
    """StableHLO text of the program with the state's shardings (see the module docstring).

    Args:
      model: the sharding model of the analysis (its program must carry ``text``).
      state: the sharding state to write down.
      communication: the communication model of ``model`` (built when not given).
      constraints: add ``sdy.sharding_constraint`` on intermediates (else arguments and
        results only, and XLA propagates the rest).

    Raises:
      ToastError: the program has no text, or the text no longer reads as the same program.
    """
    from jax.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy

    from toast.frontend.stablehlo import entry_function, read_module

    program = model.analysis.program
    if not program.text:
        raise ToastError(f"{program.name}: the program was not read from StableHLO text; nothing to annotate")
    communication = communication or CommunicationModel(model)
    scattered = communication.definition_axes(state)
    context = jax_mlir.make_ir_context()
    with context, ir.Location.unknown():
        module = ir.Module.parse(program.text)
        if constraints:  # one body per call, so that each op below stands for one op of the program
            _one_function_per_call(module, entry_function(_functions(module), program.name))
        reread, trace = read_module(module, source=program.name)
        if reread.fingerprint() != program.fingerprint():
            raise ToastError(f"{program.name}: the StableHLO text reads as another program; cannot annotate it")
        for top_op in module.body.operations:
            if top_op.operation.name == "sdy.mesh" or "sdy.sharding" in top_op.operation.attributes:
                raise ToastError(f"{program.name}: the module already carries Shardy annotations; give the "
                                 "unsharded program")
        mesh_attr = sdy.MeshAttr.get([sdy.MeshAxisAttr.get(name, size) for name, size in model.mesh.axes])
        with ir.InsertionPoint.at_block_begin(module.body):
            sdy.MeshOp(MESH_NAME, mesh_attr)

        def sharding(dim_axes: Sequence[tuple[str, ...]]) -> Any:
            dims = [sdy.DimensionShardingAttr.get([sdy.AxisRefAttr.get(a) for a in axes], True) for axes in dim_axes]
            return sdy.TensorShardingAttr.get(MESH_NAME, dims)

        entry = entry_function(_functions(module), program.name)
        arg_shardings = [sharding(model.value_axes(state, v)) if program.values[v].shape else None
                         for v in program.arguments]
        res_shardings = [sharding(model.result_axes(state, k)) if program.values[v].shape else None
                         for k, v in enumerate(program.results)]
        _set_attrs(entry, "arg_attrs", arg_shardings)
        _set_attrs(entry, "res_attrs", res_shardings)
        module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(32), model.mesh.devices)
        module.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)
        if constraints:
            for op, (mlir_op, _) in zip(program.ops, trace, strict=True):
                if op.kind in _UNCONSTRAINED:
                    continue
                # Operands the op uses sharded unlike their definition: the resharding (gather,
                # all-to-all, local slice) happens here, as the communication model has it.
                for operand, value_id in enumerate(op.operands):
                    if not program.values[value_id].shape:
                        continue
                    wanted = communication.use_axes(state, op.id, operand)
                    if wanted == (scattered.get(value_id) or model.value_axes(state, value_id)):
                        continue
                    with ir.InsertionPoint(mlir_op), mlir_op.location:
                        constraint = sdy.ShardingConstraintOp(mlir_op.operands[operand], sharding(wanted))
                    mlir_op.operands[operand] = constraint.result
                for mlir_result, value_id in zip(mlir_op.results, op.results, strict=True):
                    if not program.values[value_id].shape:
                        continue
                    dim_axes = scattered.get(value_id) or model.value_axes(state, value_id)
                    with ir.InsertionPoint.after(mlir_op), mlir_op.location:
                        constraint = sdy.ShardingConstraintOp(mlir_result, sharding(dim_axes))
                    mlir_result.replace_all_uses_except(constraint.result, constraint.operation)
        if not module.operation.verify():  # pragma: no cover - verify raises on failure
            raise ToastError(f"{program.name}: the annotated module does not verify")
        return str(module.operation.get_asm(enable_debug_info=True))


def _functions(module: Any) -> dict[str, Any]:
    """A module's ``func.func`` ops by name."""
    from jaxlib.mlir import ir

    return {ir.StringAttr(f.attributes["sym_name"]).value: f for f in module.body.operations
            if f.operation.name == "func.func"}


def _one_function_per_call(module: Any, entry: Any) -> None:
    """Clone private functions so that each ``func.call`` reached from ``entry`` calls a function of
    its own (the first call keeps the original; a clone is named ``<name>_<k>``, a name still free).

    The reader inlines a function at each call, and the analysis may shard the calls differently;
    one body per call lets each get the constraints of its own call site. Calls nest no deeper than
    the reader allows (it read the same text), so the walk ends.
    """
    from jaxlib.mlir import ir

    functions = _functions(module)
    taken = set(functions)
    called: set[str] = set()

    def walk(block: Any) -> None:
        for op in block.operations:
            if op.operation.name == "func.call":
                name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
                if name in called:
                    copies = 1
                    while f"{name}_{copies}" in taken:
                        copies += 1
                    fresh = f"{name}_{copies}"
                    clone = functions[name].operation.clone(ip=ir.InsertionPoint(module.body))
                    clone.attributes["sym_name"] = ir.StringAttr.get(fresh)
                    op.attributes["callee"] = ir.FlatSymbolRefAttr.get(fresh)
                    functions[fresh] = clone
                    taken.add(fresh)
                    name = fresh
                called.add(name)
                walk(functions[name].regions[0].blocks[0])
            for region in op.regions:
                for inner in region.blocks:
                    walk(inner)

    walk(entry.regions[0].blocks[0])


def _set_attrs(function: Any, key: str, shardings: Sequence[Any]) -> None:
    """Set ``sdy.sharding`` in each entry of a function's ``arg_attrs``/``res_attrs``."""
    from jaxlib.mlir import ir

    old = function.attributes[key] if key in function.attributes else None
    entries = []
    for index, tensor_sharding in enumerate(shardings):
        attrs = {}
        if old is not None:
            entry = ir.DictAttr(old[index])
            for position in range(len(entry)):
                attrs[entry[position].name] = entry[position].attr
        if tensor_sharding is not None:
            attrs["sdy.sharding"] = tensor_sharding
        entries.append(ir.DictAttr.get(attrs))
    function.attributes[key] = ir.ArrayAttr.get(entries)
