"""The named-dimension analysis end to end: program -> facts -> Datalog -> colors.

``analyze`` is the entry point behind ``toast analyze`` and ``toast.analyze``. It returns an
``Analysis``: the colors (classes of dimension names identified by I and M) with the
definition dims in each, the ops without a rule, statistics, and what ``toast explain``
needs to trace why two dims share a color.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from toast.analysis import cache as analysis_cache
from toast.analysis.classes import union_find
from toast.analysis.conflicts import Conflicts, build_conflicts, conflict_facts
from toast.analysis.kernel_semantics import KernelSemantics, kernel_semantics
from toast.datalog.engine import EngineName, evaluate, pick_engine
from toast.datalog.variants import assemble, load_variant
from toast.errors import InvalidRules, RuleError, ToastError
from toast.facts.numbering import DimensionNames
from toast.facts.schema import CONFLICTS, NDA
from toast.facts.writer import program_facts
from toast.frontend.ir import Program
from toast.frontend.loading import load_program_text
from toast.frontend.stablehlo import read_text
from toast.frozen import constructor, pickled_by_constructor
from toast.processes import collector_paused
from toast.resources import project_root


@pickled_by_constructor
@dataclass(frozen=True, slots=True)
class DimRef:
    """One dimension of one value definition, named as the JSON names it.

    Attributes:
      value: argument name, result path (``result[0]``) or SSA name (``%12``).
      dim: 0-based dimension index.
      size: dimension size in elements.
      loc: ``file:line`` of the Python that created the value (``""`` if unknown).
    """

    value: str
    dim: int
    size: int
    loc: str


@pickled_by_constructor
@dataclass(frozen=True, slots=True)
class Color:
    """A class of dimension names that must be sharded alike.

    Attributes:
      id: index in ``Analysis.colors`` (colors are sorted by size, largest first).
      size: number of dimension names (definitions and uses) in the class.
      dims: the definition dims in the class, in program order.
    """

    id: int
    size: int
    dims: tuple[DimRef, ...]


@dataclass(frozen=True, slots=True)
class UnruledOp:
    """An op a rule table misses: no identity rule (``Analysis.unruled_ops``: it contributed no identities)
    or no kernel class (``Analysis.unpriced_ops``: priced as a library call by its bytes)."""

    op: str
    kind: str
    loc: str


@dataclass(frozen=True, slots=True)
class Invalid:
    """A failed invariant: a row of the rules' ``invalid`` output (either stage).

    Attributes:
      check: the check's name (``ident_size``, ``self_conflict``, ...).
      file, line: the rule at fault (for a check on identities, the rule that made the identity; else the
        check's own rule); ``file`` relative to the project root where it lies inside it.
      detail: what fails the check (ids and sizes).
    """

    check: str
    file: str
    line: int
    detail: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.check}: {self.detail}"


@pickled_by_constructor
@dataclass(frozen=True, slots=True)
class Identity:
    """One row of I: names ``a`` and ``b`` identified for op ``op`` by the rule at file:line."""

    a: int
    b: int
    op: int
    file: str
    line: int


@dataclass(frozen=True, slots=True)
class Pin:
    """A sharding the program itself asks for on one value: the search is to keep it.

    Recorded for ``sdy.sharding_constraint`` (``jax.lax.with_sharding_constraint``),
    ``sdy.reshard`` and GSPMD's ``stablehlo.custom_call @Sharding`` (``mhlo.sharding``; not
    the ``{manual}`` ones of a shard_map nor shard_alike's ``{unknown shard_as N}``). The
    rules treat these ops as pass-through (colors are those of the program without them);
    the requested sharding lives only here, not in the facts.

    Attributes:
      value: the constrained value (the op's result), named as the JSON names it.
      value_id: its id in ``program.values``; its definition dims carry the pin.
      kind: the op, as unruled ops are named (``sdy.sharding_constraint``,
        ``stablehlo.custom_call @Sharding``).
      loc: ``file:line`` of the user's Python, ``""`` if unknown.
      axes: per dim, the mesh axes asked for, major to minor (a sub-axis as ``"x:(1)2"``);
        ``None`` when the sharding names no axes (a GSPMD ``mhlo.sharding`` string).
      open: per dim, whether more axes may be added (Shardy's ``{"x", ?}``); all false
        for GSPMD.
      tiles: per dim, the number of shards a GSPMD sharding asks for (``{devices=[4,2]<=[8]}``
        gives ``(4, 2)``, ``{replicated}`` all 1); ``None`` for Shardy (see ``axes``) or a
        GSPMD sharding that is not tiled (maximal, tuple).
      sharding: the requested sharding as written in the module.
    """

    value: str
    value_id: int
    kind: str
    loc: str
    axes: tuple[tuple[str, ...], ...] | None
    open: tuple[bool, ...]
    tiles: tuple[int, ...] | None
    sharding: str


@dataclass(frozen=True, slots=True)
class Analysis:
    """Result of the named-dimension analysis.

    Attributes:
      program: the analyzed program (private functions inlined).
      names: where every dimension name comes from.
      colors: classes of names under I and M, largest first.
      color_of: ``int64[names.count]``, the color id of each name.
      node_of: ``int64[names.count]``, the dimension-graph node (class under I only) of
        each name, labeled by its smallest name.
      unruled_ops: ops without a rule.
      identities: the rows of I.
      m_edges: the rows of M, ``(definition name, use name)``.
      major_factors: ``name -> factor size`` for names a reshape identifies by a major factor.
      conflicts: sharding conflicts, compatibility sets and resolution groups (sections 3.3-3.6).
      invalid: the failed invariants of both stages (the rules' ``invalid``; empty when they are sound).
      stats: counts and seconds per phase.
      pins: shardings the program asks for on its values (``Pin``), in program order.
      summed_dims: ``(op, operand index, dim)`` of every operand dim an op sums over (contracting
        dims of dot_general and convolution, reduced dims of reduce; rules' ``summed_dim``): split
        along an axis, the op's result is a partial sum over it.
      manual_dims: ``(op, operand index, dim)`` of every operand dim a manual region (shard_map) splits on the way in
        (rules' ``manual_dim``): each device's shard is its part, so a split arriving there moves nothing.
      halo_dims: ``(op, operand index, dim, low, high)`` of every operand dim an op reads with a window wider
        than one row yet maps to its result's (rules' ``halo_dim``: a causal or SAME convolution): split along
        axes, each device needs ``low`` rows (elements along the dim) of its lower neighbour and ``high`` of its
        upper one (a halo exchange).
      flop_names: ``op id -> names`` (sorted) whose sizes multiply into the op's FLOPs, 2 x their
        product (rules' ``flop_name``: a contraction's result 0 dims and its loop dims' use names);
        an op without any such name (a dot of two scalars) is absent.
      flop_scales: ``op id -> factor`` its FLOPs on a device are: the factor x the product of the local sizes of
        its ``flop_names`` (2, a multiply-add, for an op absent here): for a kernel (rules/ops/kernels.dl), its
        own ``cost_estimate`` over the product of those names' global sizes (``flop_estimate``), else its
        ``flop_coefficient`` x the sizes of the dims it reads whole (``flop_whole``). An op here need not
        have any flop name (its FLOPs are then the factor, on every device).
      flop_operands: ``op id -> operand index`` whose element type sets the op's FLOP rate (rules'
        ``flop_operand``: a kernel whose operand 0 is an int8 mask names its query); operand 0 for an op absent.
      elementwise_ops: ids of the ops of an elementwise kind (rules' ``elementwise_op``).
      kernel_semantics: what one device runs each op kind as (the rules' ``kernel_class`` and mechanics
        tables), read by the cost model's kernel plan.
      unpriced_ops: ops no rule gives a kernel class (rules' ``unpriced_op``): priced as library calls by
        their bytes.
    """

    program: Program
    names: DimensionNames
    colors: tuple[Color, ...]
    color_of: np.ndarray
    node_of: np.ndarray
    unruled_ops: tuple[UnruledOp, ...]
    identities: tuple[Identity, ...]
    m_edges: tuple[tuple[int, int], ...]
    major_factors: dict[int, int]
    conflicts: Conflicts
    invalid: tuple[Invalid, ...]
    stats: dict[str, Any]
    pins: tuple[Pin, ...] = ()
    summed_dims: frozenset[tuple[int, int, int]] = frozenset()
    halo_dims: tuple[tuple[int, int, int, int, int], ...] = ()
    manual_dims: frozenset[tuple[int, int, int]] = frozenset()
    flop_names: dict[int, tuple[int, ...]] = field(default_factory=dict)
    flop_scales: dict[int, float] = field(default_factory=dict)
    flop_operands: dict[int, int] = field(default_factory=dict)
    elementwise_ops: frozenset[int] = frozenset()
    kernel_semantics: KernelSemantics = field(default_factory=KernelSemantics)
    unpriced_ops: tuple[UnruledOp, ...] = ()

    @property
    def kernel_class(self) -> Mapping[str, str]:
        """``op kind -> kernel class`` (the rules' ``kernel_class``; custom calls by target in
        ``kernel_semantics.custom_call_class``)."""
        return self.kernel_semantics.kernel_class

    def dim_name(self, value: str, dim: int) -> int:
        """The dimension name of ``value``'s definition dim ``dim`` (JSON naming)."""
        for value_id, candidate in enumerate(self.program.values):
            if candidate.name == value:
                if not 0 <= dim < len(candidate.shape):
                    raise ToastError(f"{value} has {len(candidate.shape)} dims; no dim {dim}")
                return self.names.def_base[value_id] + dim
        raise ToastError(f"no value named '{value}' (names as in the JSON: argument names, result[N], %N)")

    def use_dim_name(self, op: int, operand: int, dim: int) -> int:
        """The dimension name of dim ``dim`` of operand ``operand`` of op ``op`` (a use)."""
        op_entry = self.program.ops[op] if 0 <= op < len(self.program.ops) else None
        if op_entry is None or not 0 <= operand < len(op_entry.operands) or not (
                0 <= dim < len(self.program.values[op_entry.operands[operand]].shape)):
            raise ToastError(f"op {op} has no operand {operand} with a dim {dim}")
        return self.names.use_name(op, operand, dim)

    def color_of_dim(self, value: str, dim: int) -> Color:
        """The color holding ``value``'s dim ``dim``."""
        return self.colors[int(self.color_of[self.dim_name(value, dim)])]


def analyze(
    source: str | Program,
    *,
    fn: Callable[..., Any] | None = None,
    args: Sequence[Any] | None = None,
    engine: EngineName = "auto",
    rules: str | Path | None = None,
    variant: str = "default",
    keep: str | Path | None = None,
    timeout_s: float = 600.0,
    factory_arguments: Mapping[str, Any] | None = None,
    cache: bool = True,
    check_invariants: bool = True,
) -> Analysis:
    """Run the named-dimension analysis.

    Args:
      source: a ``.mlir`` path, ``module:function`` naming a factory that returns
        ``(fn, example_args)`` or ``(torch.nn.Module, example_inputs)`` (its training step,
        ``toast.frontend.torch_step``), a label when ``fn`` is given, or an already read ``Program``.
      fn, args: a JAX callable and example arguments (arrays or ``jax.ShapeDtypeStruct``).
      engine: ``souffle``, ``embedded`` or ``auto`` (Soufflé when installed).
      rules: a directory of user ``.dl`` files extending or overriding the package rules.
      variant: analysis variant name (``rules/variants/<name>.toml``) or a TOML path.
      keep: directory that keeps the facts, the assembled program and the engine outputs.
      timeout_s: limit for the Datalog engine, in seconds.
      factory_arguments: keyword arguments for a ``module:function`` factory (``layers=12``).
      cache: find the analysis in the analysis cache (``toast.analysis.cache``) and keep it there; not with
        ``keep`` or a ``Program`` built by hand (no text), nor when ``$TOAST_NO_CACHE`` is set.
      check_invariants: raise ``InvalidRules`` when the rules' invariants fail (``Analysis.invalid`` has rows),
        whether the analysis was computed or read from the cache; ``False`` returns it with its rows (tests of
        the invariants, a rule author's tooling).

    Raises:
      InvalidRules: the rules' ``invalid`` output has rows (with ``check_invariants``); nothing is to be built on
        such an analysis (a broken identity, an unknown kernel class).
    """
    with collector_paused():  # lowering, reading and the analysis build millions of acyclic objects
        analysis = _analyze(source, fn=fn, args=args, engine=engine, rules=rules, variant=variant, keep=keep,
                            timeout_s=timeout_s, factory_arguments=factory_arguments, cache=cache)
    if check_invariants and analysis.invalid:
        raise InvalidRules(_invalid_message(analysis.invalid), analysis.invalid)
    return analysis


def _invalid_message(rows: Sequence[Invalid]) -> str:
    """One line for the failed invariants ``rows`` (not empty): the first row, then how many more and where,
    e.g. ``c.dl:1: ident_size: op 0: names 0 (4 elements) and 1 (8 elements) ... and 3 more: 2 ident_size at
    c.dl:1, 1 self_conflict at rules/conflicts/conflicts.dl:44`` (the places, by first row, 5 at most)."""
    first, rest = rows[0], rows[1:]
    if not rest:
        return str(first)
    places: dict[tuple[str, str, int], int] = {}
    for row in rest:
        place = (row.check, row.file, row.line)
        places[place] = places.get(place, 0) + 1
    shown = [f"{count} {check} at {file}:{line}" for (check, file, line), count in list(places.items())[:5]]
    etc = ", ..." if len(places) > 5 else ""
    return f"{first} ... and {len(rest)} more: {', '.join(shown)}{etc}"


def _analyze(
    source: str | Program,
    *,
    fn: Callable[..., Any] | None,
    args: Sequence[Any] | None,
    engine: EngineName,
    rules: str | Path | None,
    variant: str,
    keep: str | Path | None,
    timeout_s: float,
    factory_arguments: Mapping[str, Any] | None,
    cache: bool,
) -> Analysis:
    """``analyze`` without the invariants' check: the analysis computed, or read from the cache."""
    chosen = pick_engine(engine)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    chosen_variant = load_variant(variant)
    user_rules = Path(rules) if rules is not None else None
    keep_dir = Path(keep) if keep else None
    # Assembled before the program is read and the cache asked: a bad --rules folder is an error either way,
    # and the key holds every file the two programs read.
    assembled = assemble(chosen_variant, user_rules=user_rules, stage=NDA)
    conflict_program = assemble(chosen_variant, user_rules=user_rules, stage=CONFLICTS)
    if isinstance(source, Program):
        program: Program | None = source
        text, name = source.text, source.name
    else:
        program = None
        text, name = load_program_text(source, args=args, fn=fn, factory_arguments=factory_arguments)
    key = None
    if cache and keep_dir is None and text and analysis_cache.enabled():
        with contextlib.suppress(RuleError):  # rules the preprocessor cannot read: the engine says why, uncached
            key = analysis_cache.analysis_key(
                text=text, name=name, sources=assembled.sources() + conflict_program.sources(),
                variant=chosen_variant, engine=chosen, extra=("program" if program is not None else "source",))
        cached = analysis_cache.load(key) if key is not None else None
        if isinstance(cached, Analysis):
            seconds = {"read": round(time.perf_counter() - start, 4)}
            return replace(cached, stats={**cached.stats, "seconds": seconds, "cache": "hit"})
    if program is None:
        program = read_text(text, source=name)
    timings["read"] = time.perf_counter() - start

    start = time.perf_counter()
    facts, names = program_facts(program)
    timings["facts"] = time.perf_counter() - start
    start = time.perf_counter()
    outputs = evaluate(assembled.text, facts, NDA.outputs, engine=chosen, keep=keep_dir, timeout_s=timeout_s)
    timings["datalog"] = time.perf_counter() - start

    start = time.perf_counter()
    classes = _classes(names.count, outputs)
    timings["classes"] = time.perf_counter() - start

    # Second stage: conflicts, boxes (Datalog), crossing paths, closure, layers (Python).
    start = time.perf_counter()
    conflict_inputs = conflict_facts(program, names, classes.color_of, classes.node_of)
    conflict_outputs = evaluate(conflict_program.text, conflict_inputs, CONFLICTS.outputs, engine=chosen,
                                keep=keep_dir / "conflicts" if keep_dir else None, timeout_s=timeout_s)
    conflicts = build_conflicts(program, names, classes.color_of, classes.node_of, classes.m_pairs,
                                conflict_outputs, layer_heuristic=chosen_variant.layer_heuristic)
    timings["conflicts"] = time.perf_counter() - start

    analysis = _build(program, names, outputs, classes, conflicts, run_stats={
        "engine": chosen,
        "variant": assembled.variant.name,
        "seconds": {k: round(v, 4) for k, v in timings.items()},
        "facts": sum(len(rows) for rows in facts.values()),
        "cache": "miss" if key is not None else "off",
    })
    if key is not None:
        analysis_cache.store(key, analysis)
    return analysis


@functools.lru_cache(maxsize=256)
def display_rule_file(path: str) -> str:
    """A rule file path relative to the project root when it lies inside it."""
    try:
        return Path(path).resolve().relative_to(project_root()).as_posix()
    except ValueError:
        return path


@dataclass(frozen=True, slots=True)
class _Classes:
    color_of: np.ndarray  # color id of each name (ids by size, largest first)
    color_sizes: tuple[int, ...]  # names per color id
    node_of: np.ndarray  # dimension-graph node of each name (its smallest I-class member)
    m_edges: tuple[tuple[int, int], ...]
    m_pairs: np.ndarray  # ``int64[len(m_edges), 2]``: the same edges


def _classes(count: int, outputs: dict[str, list[tuple]]) -> _Classes:
    """Colors (classes under I and M) and nodes (classes under I alone) of every name."""
    identities = _pairs(outputs["ident"])
    m_edges = tuple(map(tuple, outputs["m_edge"]))  # the rows (a, b) themselves
    node_of = union_find(count, identities)
    m_pairs = _pairs(m_edges)
    color_label = union_find(count, np.concatenate([identities, m_pairs]))
    # Colors sorted by size (largest first), ties by smallest member: deterministic ids.
    labels, sizes = np.unique(color_label, return_counts=True)
    order = sorted(range(len(labels)), key=lambda k: (-int(sizes[k]), int(labels[k])))
    rank_of_label = np.empty(int(labels.max()) + 1 if len(labels) else 0, dtype=np.int64)
    rank_of_label[labels[order]] = np.arange(len(order))
    color_of = rank_of_label[color_label] if count else np.zeros(0, dtype=np.int64)
    return _Classes(color_of, tuple(int(sizes[k]) for k in order), node_of, m_edges, m_pairs)


def _pairs(rows: Sequence[tuple]) -> np.ndarray:
    """``int64[len(rows), 2]``: the first two columns of ``rows`` (an edge list for ``union_find``)."""
    count = len(rows)
    first = np.fromiter(map(_FIRST, rows), dtype=np.int64, count=count)
    second = np.fromiter(map(_SECOND, rows), dtype=np.int64, count=count)
    return np.stack([first, second], axis=1)


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def _build(program: Program, names: DimensionNames, outputs: dict[str, list[tuple]], classes: _Classes,
           conflicts: Conflicts, *, run_stats: dict[str, Any]) -> Analysis:
    """The ``Analysis`` of the engines' outputs; ``run_stats`` (engine, variant, seconds, facts) end its
    ``stats``."""
    identities = _identities(outputs["ident"])
    count = names.count
    color_of, node_of = classes.color_of, classes.node_of
    members: list[list[DimRef]] = [[] for _ in classes.color_sizes]
    # In name order (values in order, each one's dims in order); a value's dims named from its def_base.
    color_list = color_of.tolist()
    make_dim_ref = _MAKE_DIM_REF
    for value, base in zip(program.values, names.def_base, strict=True):
        value_name, loc = value.name, value.loc
        for dim, size in enumerate(value.shape):
            members[color_list[base + dim]].append(make_dim_ref(value_name, dim, size, loc))
    colors = tuple(Color(rank, size, tuple(members[rank])) for rank, size in enumerate(classes.color_sizes))

    unruled = tuple(
        UnruledOp(program.op_label(op_id), _kind_label(program, op_id, kind), program.ops[op_id].loc)
        for op_id, kind in outputs["unruled_op"]
    )
    unpriced = tuple(
        UnruledOp(program.op_label(op_id), _kind_label(program, op_id, kind), program.ops[op_id].loc)
        for op_id, kind in outputs["unpriced_op"]
    )
    invalid = tuple(Invalid(str(check), display_rule_file(str(file)), int(line), str(detail))
                    for check, file, line, detail in (*outputs["invalid"], *conflicts.invalid))
    stats = {
        "ops": len(program.ops),
        "values": len(program.values),
        "dimension_names": count,
        "definition_dims": len(names.defs),
        "colors": len(colors),
        # A node is labeled by its smallest name (``union_find``): one name per node is its own label.
        "dimension_graph_nodes": int(np.count_nonzero(node_of == np.arange(len(node_of)))),
        "identities": len(identities),
        "m_edges": len(classes.m_edges),
        "unruled_ops": len(unruled),
        "unpriced_ops": len(unpriced),
        **conflicts.stats,
        **run_stats,
    }
    flop_names = _flop_names(outputs["flop_name"])
    return Analysis(
        program=program,
        names=names,
        colors=colors,
        color_of=color_of,
        node_of=node_of,
        unruled_ops=unruled,
        identities=identities,
        m_edges=classes.m_edges,
        major_factors={int(n): int(s) for n, s in outputs["major_factor"]},
        conflicts=conflicts,
        invalid=invalid,
        stats=stats,
        pins=program_pins(program),
        summed_dims=frozenset((int(op), int(index), int(dim)) for op, index, dim in outputs["summed_dim"]),
        manual_dims=frozenset((int(op), int(index), int(dim)) for op, index, dim in outputs["manual_dim"]),
        halo_dims=tuple(sorted((int(op), int(index), int(dim), int(low), int(high))
                               for op, index, dim, low, high in outputs["halo_dim"])),
        flop_names=flop_names,
        flop_scales=_flop_scales(outputs, program, names, flop_names),
        flop_operands={int(op): int(index) for op, index in outputs["flop_operand"]},
        elementwise_ops=frozenset(int(op) for (op,) in outputs["elementwise_op"]),
        kernel_semantics=kernel_semantics(outputs),
        unpriced_ops=unpriced,
    )


_MAKE_IDENTITY = constructor(Identity)
_MAKE_DIM_REF = constructor(DimRef)


def _identities(rows: list[tuple]) -> tuple[Identity, ...]:
    """The ``Identity`` of each ``ident`` row ``(a, b, op, file, line)``, its file as ``display_rule_file`` shows it
    (column by column: a 100k-op program has hundreds of thousands of rows, and a handful of files)."""
    if not rows:
        return ()
    a, b, op, files, line = zip(*rows, strict=True)
    return tuple(map(_MAKE_IDENTITY, a, b, op, map(display_rule_file, files), line))


def _flop_names(rows: list[tuple]) -> dict[int, tuple[int, ...]]:
    """``op -> sorted names`` from the ``flop_name`` rows (one pass, then one sort per op)."""
    grouped: dict[int, list[int]] = {}
    for op, name in rows:
        grouped.setdefault(int(op), []).append(int(name))
    return {op: tuple(sorted(names)) for op, names in grouped.items()}


def _flop_scales(outputs: Mapping[str, list[tuple]], program: Program, names: DimensionNames,
                 flop_names: Mapping[int, tuple[int, ...]]) -> dict[int, float]:
    """``op -> factor`` of ``Analysis.flop_scales`` from the ``flop_estimate``, ``flop_coefficient`` and
    ``flop_whole`` rows (the estimate, decimal text, wins)."""
    defs = len(names.defs)

    def global_size(name: int) -> int:
        if name < defs:
            value_id, dim = names.defs[name]
        else:
            op_id, operand, dim = names.uses[name - defs]
            value_id = program.ops[op_id].operands[operand]
        return program.values[value_id].shape[dim]

    scales: dict[int, float] = {}
    for op, coefficient in outputs["flop_coefficient"]:
        scales[int(op)] = float(coefficient)
    for op, index, dim in outputs["flop_whole"]:
        op = int(op)
        shape = program.values[program.ops[op].operands[int(index)]].shape
        scales[op] = scales.get(op, 2.0) * shape[int(dim)]
    for op, flops in outputs["flop_estimate"]:
        whole = math.prod(global_size(name) for name in flop_names.get(int(op), ()))
        scales[int(op)] = int(flops) / max(whole, 1)
    return scales


def program_pins(program: Program) -> tuple[Pin, ...]:
    """The shardings ``program``'s constraint ops ask for (see ``Pin``)."""
    pins = []
    for op in program.ops:
        if len(op.results) != 1:
            continue
        value = program.values[op.results[0]]
        if op.kind in ("sdy.sharding_constraint", "sdy.reshard"):
            requested = op.attr("sharding")
            if not isinstance(requested, dict):
                continue
            mesh = f"@{requested['mesh']}" if requested["mesh"] else "mesh<...>"
            dims = ", ".join("{" + ", ".join([f'"{a}"' for a in axes] + ["?"] * is_open) + "}"
                             for axes, is_open in zip(requested["dims"], requested["open"], strict=True))
            pins.append(Pin(value.name, value.id, op.kind, op.loc, requested["dims"],
                            tuple(bool(o) for o in requested["open"]), None, f"<{mesh}, [{dims}]>"))
        elif op.kind == "stablehlo.custom_call" and op.attr("call_target_name") == "Sharding":
            text = str(op.attr("mhlo.sharding", ""))
            if not text or text.startswith("{unknown") or "manual" in text.split("last_tile_dims")[0]:
                continue  # shard_map's manual plumbing, shard_alike's "{unknown shard_as N}": no request
            pins.append(Pin(value.name, value.id, _kind_label(program, op.id, op.kind), op.loc, None,
                            (False,) * len(value.shape), _gspmd_tiles(text, len(value.shape)), text))
    return tuple(pins)


def _gspmd_tiles(text: str, rank: int) -> tuple[int, ...] | None:
    """Shards per dim of a GSPMD ``HloSharding`` string: ``{devices=[2,1,4]<=[8]
    last_tile_dim_replicate}`` -> ``(2, 1)``; ``{replicated}`` -> all 1; ``None`` otherwise."""
    body = text.strip().removeprefix("{").removesuffix("}").strip()
    if body == "replicated":
        return (1,) * rank
    if not body.startswith("devices=[") or "{" in body.split("last_tile_dims=")[0]:
        return None  # maximal, tuple or an unknown form
    tiles = tuple(int(t) for t in body[len("devices=["):body.index("]")].split(","))
    if "last_tile_dim_replicate" in body:
        tiles = tiles[:-1]
    elif "last_tile_dims=" in body:
        tiles = tiles[:rank]
    return tiles if len(tiles) == rank else None


def _kind_label(program: Program, op_id: int, kind: str) -> str:
    op = program.ops[op_id]
    if kind == "stablehlo.custom_call":
        return f"stablehlo.custom_call @{op.attr('call_target_name', '?')}"
    return kind
