"""The one source of truth for the relations Python and the rules exchange.

``INPUTS`` are the facts ``toast.facts`` writes; ``OUTPUTS`` are the relations the rules
derive and Python reads back (reading back checks their names and arity against this list).
Both are declared, once, in ``rules/schema.dl``, which is generated from this module
(``python -m toast.facts > rules/schema.dl``; a test checks it is up to date). The second
stage, conflicts, has its own inputs (the classes Python computes from the first stage's
outputs) and outputs, declared in ``rules/conflicts/schema.dl``
(``python -m toast.facts conflicts > rules/conflicts/schema.dl``).

All ids are non-negative integers of their own Soufflé subtype of ``number`` (``ID_TYPES``:
``OpId``, ``ValueId``, ``UseId``, ``NameId``, and ``NodeId``, ``ColorId`` in the conflicts
stage), so that a rule joining an op id with a value id is a type error in both engines, not
a wrong color. ``Dim`` is a 0-based dimension index, ``Size`` a dimension size in elements.
"""

from __future__ import annotations

from dataclasses import dataclass

from toast.errors import EngineError

# The id types: name -> what a value of it is. Each is ``.type NAME <: number`` in the generated schemas.
ID_TYPES: dict[str, str] = {
    "OpId": "an op instance (its index in the program's ops)",
    "ValueId": "an SSA value",
    "UseId": "one operand position of one op",
    "NameId": "a dimension name: one dimension of one definition or of one use",
    "NodeId": "a node of the dimension graph (a class under I), labeled by its smallest name",
    "ColorId": "a color (a class under I and M), numbered largest first",
}


@dataclass(frozen=True, slots=True)
class Relation:
    """A relation's name, typed columns (``name:type``, a primitive or an ``ID_TYPES`` name) and what a row
    means."""

    name: str
    columns: tuple[tuple[str, str], ...]
    doc: str

    @property
    def arity(self) -> int:
        return len(self.columns)

    @property
    def bases(self) -> tuple[str, ...]:
        """Each column's primitive type (``number`` for an id type)."""
        return tuple("number" if type_ in ID_TYPES else type_ for _, type_ in self.columns)

    def declaration(self) -> str:
        cols = ", ".join(f"{name}: {type_}" for name, type_ in self.columns)
        return f".decl {self.name}({cols})"


def _rel(name: str, columns: str, doc: str) -> Relation:
    parsed = tuple(
        (part.split(":")[0].strip(), part.split(":")[1].strip()) for part in columns.split(",")
    )
    return Relation(name, parsed, doc)


INPUTS: tuple[Relation, ...] = (
    # --- program structure ---------------------------------------------------------------
    _rel("op", "Op:OpId, Kind:symbol",
         "Op is an op instance of kind Kind (full name, e.g. \"stablehlo.add\", \"func.call\")."),
    _rel("operand", "Op:OpId, Index:number, Use:UseId, Value:ValueId",
         "Operand Index of Op is Use, a use of Value. Every operand position is its own use."),
    _rel("result", "Op:OpId, Index:number, Value:ValueId",
         "Result Index of Op defines Value."),
    _rel("block_arg", "Op:OpId, Region:number, Index:number, Value:ValueId",
         "Argument Index of the entry block of region Region of Op defines Value "
         "(while/case regions, sdy.manual_computation/named_computation bodies; the inlined callee "
         "body of a func.call is region 0)."),
    _rel("region_return", "Op:OpId, Region:number, Return:OpId",
         "Return is the terminator (stablehlo.return / func.return / sdy.return) of region Region of Op."),
    _rel("def_dim", "Name:NameId, Value:ValueId, Dim:number, Size:number",
         "Name is the fresh dimension name of dimension Dim (of Size elements) of Value's definition."),
    _rel("use_dim", "Name:NameId, Use:UseId, Dim:number",
         "Name is the fresh dimension name of dimension Dim of the use Use."),
    # --- op attributes -------------------------------------------------------------------
    _rel("custom_call_target", "Op:OpId, Target:symbol",
         "Op is a stablehlo.custom_call of call_target_name Target."),
    _rel("custom_call_kernel", "Op:OpId, Name:symbol",
         "custom_call Op runs the kernel Name: a Pallas TPU kernel's kernel_name attribute, or the name its "
         "backend_config gives (a Pallas GPU / Triton kernel). A kernel's identity is its target and its name."),
    _rel("kernel_cost_estimate", "Op:OpId, Flops:symbol, Bytes:symbol, Transcendentals:symbol",
         "custom_call Op carries its kernel's own cost estimate (a Pallas TPU kernel's backend_config "
         "cost_estimate) over its whole shapes: FLOPs, bytes accessed and transcendentals, each as decimal "
         "text (the counts outgrow a 32-bit Datalog number)."),
    _rel("kernel_config", "Op:OpId, Key:symbol, Value:symbol",
         "custom_call Op's kernel is configured with Key = Value: the entries of a cuDNN fused attention call's "
         "cudnn_fmha_backend_config, Key a dotted path (\"mask_type\", "
         "\"bmm1_dot_dimension_numbers.lhs_batch_dimensions\"), Value its JSON text, a list's items joined by "
         "commas (\"CAUSAL\", \"0,2\")."),
    _rel("dot_batch", "Op:OpId, LhsDim:number, RhsDim:number, OutDim:number",
         "dot_general Op pairs batch dims LhsDim and RhsDim; they become result dim OutDim."),
    _rel("dot_contract", "Op:OpId, LhsDim:number, RhsDim:number",
         "dot_general Op contracts lhs dim LhsDim with rhs dim RhsDim."),
    _rel("dot_free", "Op:OpId, Operand:number, InDim:number, OutDim:number",
         "Free (non-batch, non-contracting) dim InDim of operand Operand (0 lhs, 1 rhs) of "
         "dot_general Op becomes result dim OutDim."),
    _rel("transpose_perm", "Op:OpId, OutDim:number, InDim:number",
         "transpose Op moves operand dim InDim to result dim OutDim (permutation[OutDim] = InDim)."),
    _rel("broadcast_map", "Op:OpId, InDim:number, OutDim:number",
         "broadcast_in_dim Op maps operand dim InDim to result dim OutDim (broadcast_dimensions)."),
    _rel("reduce_keep", "Op:OpId, InDim:number, OutDim:number",
         "reduce Op keeps input dim InDim as result dim OutDim (InDim is not reduced)."),
    _rel("reshape_factor", "Op:OpId, InDim:number, OutDim:number, Size:number, Whole:number",
         "reshape Op shares a major factor of Size elements between operand dim InDim and result "
         "dim OutDim; Whole = 1 when that factor is the whole of both dims (the dim is kept)."),
    _rel("concat_dim", "Op:OpId, Dim:number",
         "concatenate Op concatenates along Dim."),
    _rel("reverse_dim", "Op:OpId, Dim:number",
         "reverse Op reverses Dim."),
    _rel("sort_dim", "Op:OpId, Dim:number",
         "sort Op sorts along Dim."),
    _rel("pad_dim", "Op:OpId, Dim:number, Low:number, High:number, Interior:number",
         "pad Op pads Dim with Low/High edge and Interior padding (elements)."),
    _rel("window_dim", "Op:OpId, Dim:number, Size:number, Stride:number, Padded:number",
         "reduce_window / select_and_scatter Op has a window of Size with Stride on Dim; "
         "Padded = 1 when the dim has edge padding or dilation."),
    _rel("conv_batch", "Op:OpId, LhsDim:number, OutDim:number",
         "convolution Op: lhs batch dim LhsDim becomes result batch dim OutDim (batch_group_count = 1)."),
    _rel("conv_feature", "Op:OpId, LhsDim:number, RhsDim:number",
         "convolution Op contracts lhs input-feature dim LhsDim with kernel input-feature dim "
         "RhsDim (feature_group_count = 1)."),
    _rel("conv_out_feature", "Op:OpId, RhsDim:number, OutDim:number",
         "convolution Op: kernel output-feature dim RhsDim becomes result feature dim OutDim "
         "(batch_group_count = 1 and feature_group_count = 1)."),
    _rel("conv_kernel_out_feature", "Op:OpId, RhsDim:number",
         "convolution Op's kernel (operand 1) has its output-feature dim at RhsDim (whatever the group "
         "counts): every other kernel dim is a loop of the convolution's multiply-adds."),
    _rel("conv_spatial", "Op:OpId, LhsDim:number, RhsDim:number, OutDim:number",
         "convolution Op slides kernel spatial dim RhsDim over lhs spatial dim LhsDim, giving "
         "result spatial dim OutDim."),
    _rel("conv_window", "Op:OpId, LhsDim:number, Stride:number, Low:number, High:number, Dilated:number",
         "convolution Op moves its window along lhs spatial dim LhsDim by Stride, over that dim padded with "
         "Low and High elements (edge padding; negative crops); Dilated = 1 when lhs_dilation, rhs_dilation "
         "or window_reversal along it is not the identity."),
    _rel("gather_offset", "Op:OpId, OperandDim:number, OutDim:number, SliceSize:number",
         "gather Op takes slices of SliceSize along operand dim OperandDim into result offset dim OutDim."),
    _rel("gather_batch", "Op:OpId, IndicesDim:number, OutDim:number",
         "gather Op: start-indices dim IndicesDim becomes result batch dim OutDim."),
    _rel("gather_operand_batch", "Op:OpId, OperandDim:number, IndicesDim:number",
         "gather Op: explicit batching dim OperandDim of the operand pairs with indices dim IndicesDim."),
    _rel("gather_index_column", "Op:OpId, VectorDim:number, Column:number, OperandDim:number, SliceSize:number",
         "gather Op's start index vectors lie along indices dim VectorDim (the indices' rank when implicit); "
         "their entry Column starts the slice of SliceSize along operand dim OperandDim (start_index_map)."),
    _rel("scatter_inputs", "Op:OpId, Count:number",
         "scatter Op has Count inputs (operands 0..Count-1), then the indices (operand Count), "
         "then Count updates."),
    _rel("scatter_window", "Op:OpId, InputDim:number, UpdateDim:number",
         "scatter Op writes update window dim UpdateDim along input dim InputDim."),
    _rel("scatter_index", "Op:OpId, IndicesDim:number, UpdateDim:number",
         "scatter Op: scatter-indices dim IndicesDim pairs with update scatter dim UpdateDim."),
    _rel("scatter_input_batch", "Op:OpId, InputDim:number, IndicesDim:number",
         "scatter Op: explicit batching dim InputDim of the inputs pairs with indices dim IndicesDim."),
    _rel("scatter_index_column", "Op:OpId, VectorDim:number, Column:number, InputDim:number, WindowSize:number",
         "scatter Op's index vectors lie along indices dim VectorDim (the indices' rank when implicit); their "
         "entry Column starts the update window of WindowSize along input dim InputDim "
         "(scatter_dims_to_operand_dims)."),
    _rel("scatter_combiner", "Op:OpId, Kind:symbol",
         "scatter Op's update computation is one op of kind Kind applied to the input and the update "
         "(stablehlo.add for a scatter-add)."),
    _rel("iota_dim", "Op:OpId, Dim:number",
         "iota Op counts along its result dim Dim (iota_dimension): result[..., i, ...] = i."),
    _rel("compare_direction", "Op:OpId, Direction:symbol",
         "compare Op compares its operand 0 with its operand 1 by Direction (EQ, NE, LT, LE, GT, GE)."),
    _rel("integer_scalar", "Op:OpId, Value:number",
         "constant Op is the rank-0 integer Value (one that fits a 32-bit number)."),
    _rel("sharding_group", "Op:OpId, Group:number",
         "sdy.sharding_group Op tags its operand with group_id Group: all values of one group are "
         "sharded alike."),
)

# The one output of the invariants of both stages: each op family file and stage adds its checks as rules
# ``invalid("name", __FILE__, __LINE__, Detail) :- ...`` (a relation per check would be one golden per check).
INVALID = _rel("invalid", "Check:symbol, File:symbol, Line:number, Detail:symbol",
               "Invariant (must be empty): check Check, stated by the rule at File:Line, fails; Detail names "
               "what fails it (ids and sizes, built with cat and to_string).")

OUTPUTS: tuple[Relation, ...] = (
    _rel("ident", "A:NameId, B:NameId, Op:OpId, File:symbol, Line:number",
         "Identity I: dimension names A and B must be sharded alike, by the rule at File:Line for Op."),
    _rel("m_edge", "Def:NameId, Use:NameId",
         "Map M: dimension name Def of a definition flows to dimension name Use of one of its uses."),
    _rel("major_factor", "Name:NameId, Size:number",
         "Name is identified through a reshape only by its major factor of Size elements: an axis "
         "sharding it must divide Size."),
    _rel("unruled_op", "Op:OpId, Kind:symbol",
         "Op, of kind Kind, has no rule (a custom_call is ruled per call target): it contributes no "
         "identities, which is safe, and is reported."),
    _rel("summed_dim", "Op:OpId, Index:number, Dim:number",
         "Op sums over dim Dim of its operand Index (a contracting dim of a dot_general or convolution, "
         "a reduced dim of a reduce): split along an axis, the result is a partial sum over that axis "
         "(an all-reduce or reduce-scatter)."),
    _rel("manual_dim", "Op:OpId, Index:number, Dim:number",
         "Dim Dim of Op's operand Index enters a manual region split (shard_map: sdy.manual_computation, "
         "@SPMDFullToShardShape): each device holds its own shard of the global value, so a split of the "
         "dim arriving there moves nothing."),
    _rel("halo_dim", "Op:OpId, Index:number, Dim:number, Low:number, High:number",
         "Op's result row i along dim Dim of its operand Index reads that dim's rows i - Low to i + High "
         "(a window wider than 1, identified with the result's dim): split along axes, each device needs "
         "Low rows (elements) from its lower neighbour and High from its upper one (a halo exchange: "
         "collective-permutes)."),
    _rel("flop_name", "Op:OpId, Name:NameId",
         "Dimension name Name (of Op's result 0 or of a use of Op) multiplies into Op's FLOPs: "
         "2 x the product of the (local) sizes of Op's names; derived for contractions (rules/ops/contraction.dl) "
         "and kernels (rules/ops/kernels.dl)."),
    _rel("flop_whole", "Op:OpId, Index:number, Dim:number",
         "Dim Dim of operand Index of Op multiplies into Op's FLOPs at its whole size, whatever the sharding "
         "(a kernel reads that dim whole); with flop_name and flop_coefficient."),
    _rel("flop_coefficient", "Op:OpId, Coefficient:number",
         "Op's FLOPs are Coefficient (not 2) x the product of its flop_name names' local sizes and its "
         "flop_whole dims' sizes (an attention kernel's 4 x B x H x Sq x Sk x D)."),
    _rel("flop_estimate", "Op:OpId, Flops:symbol",
         "Op's FLOPs over its whole shapes are Flops (decimal text: a kernel's own cost_estimate); on one "
         "device each flop_name name divides them by its split (global over local size)."),
    _rel("flop_operand", "Op:OpId, Index:number",
         "Op's FLOPs run at the peak of operand Index's element type (without a row: operand 0's; a kernel "
         "whose operand 0 is a mask, rules/ops/kernels.dl)."),
    _rel("elementwise_op", "Op:OpId",
         "Op is of an elementwise kind (elementwise_kind in rules/ops/elementwise.dl)."),
    # --- what one device runs each op as: the kernel plan of the cost model reads these ---------
    _rel("kernel_class", "Kind:symbol, Class:symbol",
         "Ops of kind Kind run on a device as Class: view (the result is its operand's buffer, no kernel), "
         "inline (a call whose region runs in place), loop, branch, terminator, matmul (a library call "
         "priced by its FLOPs), library (a kernel of its own, priced by its bytes and any flop_name), "
         "reduction (ends a kernel: its producers fuse into it), scatter (operands: N inputs, the indices, "
         "N updates added atomically), cheap (recomputed in every kernel that reads it) or fusible "
         "(loop-fused with its readers). Each op family file classifies its kinds."),
    _rel("custom_call_class", "Target:symbol, Class:symbol",
         "A stablehlo.custom_call of call_target_name Target runs as Class (as in kernel_class)."),
    _rel("kernel_call_class", "Target:symbol, Name:symbol, Class:symbol",
         "A stablehlo.custom_call of call_target_name Target running kernel Name (custom_call_kernel) runs "
         "as Class (as in kernel_class); it takes precedence over the target's custom_call_class."),
    _rel("in_place_update", "Kind:symbol, Target:number, Update:number",
         "An op of kind Kind writes its operand Update into its operand Target in place: the result is "
         "Target's buffer, Target is not read."),
    _rel("touched_operand", "Kind:symbol, Index:number",
         "An op of kind Kind reads of its operand Index only the elements it returns (a slice, a gather)."),
    _rel("library_reads_in_place", "Kind:symbol",
         "A library call reading the result of an op of kind Kind reads it where it lies in the op's "
         "operand (XLA's dynamic-slice fusion): the op needs no kernel of its own."),
    _rel("multi_output_fusible", "Kind:symbol",
         "Ops of kind Kind over the same shape and dims that read a common buffer run as one kernel "
         "(XLA's multi-output fusion of sibling reductions)."),
    _rel("keeps_elements", "Kind:symbol",
         "An op of kind Kind returns the elements of its operand 0, rearranged or converted: a gradient "
         "stays a gradient through it."),
    _rel("window_selection", "Kind:symbol, Source:number, Init:number",
         "An op of kind Kind runs as a window reduction that stores the selected element per window, then "
         "a scatter-add of its operand Source into its operand Init broadcast to the result's shape (a "
         "max pool's gradient, as XLA expands select_and_scatter)."),
    _rel("unpriced_op", "Op:OpId, Kind:symbol",
         "Op, of kind Kind, has no kernel_class (a custom_call: no kernel_call_class for its kernel, no "
         "custom_call_class for its target): the "
         "cost model prices it as a library call by its bytes, and it is reported."),
    INVALID,
)

CONFLICT_INPUTS: tuple[Relation, ...] = (
    _rel("def_class", "Value:ValueId, Dim:number, Node:NodeId, Color:ColorId",
         "Dim of Value's definition lies in dimension-graph node Node (its class under I, labeled "
         "by its smallest name) and in color Color (its class under I and M). Listed only for dims "
         "whose color occurs more than once in Value: no other dim can be in a conflict."),
    _rel("use_class", "Use:UseId, Value:ValueId, Dim:number, Node:NodeId, Color:ColorId",
         "Dim of Use, a use of Value, lies in node Node and color Color; listed only for dims whose "
         "color occurs more than once in Use."),
)

CONFLICT_OUTPUTS: tuple[Relation, ...] = (
    _rel("color_conflict_def", "Value:ValueId, DimA:number, DimB:number, Color:ColorId",
         "Section 3.3: Color occurs at dims DimA < DimB of Value's definition (after identifying "
         "names with I and M)."),
    _rel("color_conflict_use", "Use:UseId, DimA:number, DimB:number, Color:ColorId",
         "Section 3.3: Color occurs at dims DimA < DimB of the use Use."),
    _rel("conflict_def", "NodeA:NodeId, NodeB:NodeId, Value:ValueId, DimA:number, DimB:number",
         "Section 3.4: nodes NodeA < NodeB of one color annotate dims DimA and DimB of Value's "
         "definition: a conflict edge of the dimension graph (shard NodeA or NodeB, not both)."),
    _rel("conflict_use", "NodeA:NodeId, NodeB:NodeId, Use:UseId, DimA:number, DimB:number",
         "Section 3.4: nodes NodeA < NodeB of one color annotate dims DimA and DimB of Use."),
    _rel("box", "DefA:NodeId, DefB:NodeId, UseA:NodeId, UseB:NodeId, Value:ValueId, Use:UseId",
         "Section 3.5: the conflict (DefA, DefB) on Value's definition and the conflict on Use, a use "
         "of Value, form a box: M joins DefA to UseA and DefB to UseB, so sharding DefA and UseA "
         "together needs no resharding. DefA < DefB. Python drops boxes a path crosses."),
    INVALID,
)


@dataclass(frozen=True, slots=True)
class Stage:
    """One Datalog program of the analysis: its inputs, its outputs, and its declarations file
    (relative to ``rules/``)."""

    name: str
    inputs: tuple[Relation, ...]
    outputs: tuple[Relation, ...]
    schema_file: str
    title: str


NDA = Stage("nda", INPUTS, OUTPUTS, "schema.dl",
            "the named-dimension analysis (section 3.1): facts from toast.facts; I, M and reports")
CONFLICTS = Stage("conflicts", CONFLICT_INPUTS, CONFLICT_OUTPUTS, "conflicts/schema.dl",
                  "sharding conflicts and boxes (sections 3.3-3.5): classes from toast.analysis.classes")
STAGES: dict[str, Stage] = {stage.name: stage for stage in (NDA, CONFLICTS)}

RELATIONS: dict[str, Relation] = {r.name: r for stage in STAGES.values() for r in stage.inputs + stage.outputs}


def schema_dl(stage: Stage = NDA) -> str:
    """The text of the stage's declarations file: a documented ``.decl`` per relation."""
    lines = [
        f"// The relations Python and the rules exchange in {stage.title}:",
        "// inputs (facts Python writes) and outputs (what the rules derive and Python reads back).",
        f"// GENERATED from toast/facts/schema.py by `python -m toast.facts {stage.name} > rules/{stage.schema_file}`;"
        " do not edit.",
        "// Ids have types of their own (a rule that joins an op id with a value id is a type error);",
        "// Dim is a 0-based dim index, Size a dim's elements.",
        "",
    ]
    used = sorted({type_ for relation in stage.inputs + stage.outputs for _, type_ in relation.columns
                   if type_ in ID_TYPES}, key=list(ID_TYPES).index)
    for type_ in used:
        lines.append(f"/** {ID_TYPES[type_][0].upper()}{ID_TYPES[type_][1:]}. */")
        lines.append(f".type {type_} <: number")
    for title, relations, io in (("Inputs", stage.inputs, ".input"), ("Outputs", stage.outputs, ".output")):
        lines += ["", f"//---- {title} " + "-" * (86 - len(title)), ""]
        for relation in relations:
            lines.append(f"/** {relation.doc} */")
            lines.append(relation.declaration())
            lines.append(f"{io} {relation.name}")
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def check_rows(name: str, rows: list[tuple]) -> list[tuple]:
    """Return ``rows`` after checking ``name`` is a known relation and every row's arity."""
    relation = RELATIONS.get(name)
    if relation is None:
        raise EngineError(f"engine returned unknown relation '{name}'")
    arity = relation.arity
    if set(map(len, rows)) - {arity}:  # lengths in one C loop: a relation can have a million rows
        width = next(len(row) for row in rows if len(row) != arity)  # the first bad row's
        raise EngineError(
            f"relation '{name}' has rows of {width} columns, expected {arity} "
            f"({', '.join(c for c, _ in relation.columns)})"
        )
    return rows
