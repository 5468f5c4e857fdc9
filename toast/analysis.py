"""The named-dimension analysis end to end: program -> facts -> Datalog -> colors.

``analyze`` is the entry point behind ``toast analyze`` and ``toast.analyze``. It returns an
``Analysis``: the colors (classes of dimension names identified by I and M) with the
definition dims in each, the ops without a rule, statistics, and what ``toast explain``
needs to trace why two dims share a color.
"""

from __future__ import annotations

import functools
import importlib
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import numpy as np

from toast import stablehlo
from toast.classes import union_find
from toast.datalog.souffle import run_souffle, souffle_binary, write_relations
from toast.errors import InputError, ToastError
from toast.facts import DimensionNames, program_facts
from toast.ir import Program
from toast.schema import OUTPUTS, check_rows
from toast.variants import PROGRAM_NAME, ROOT, assemble, load_variant

EngineName = Literal["auto", "souffle", "embedded"]


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
    """An op no rule covers: it contributed no identities."""

    op: str
    kind: str
    loc: str


@dataclass(frozen=True, slots=True)
class Identity:
    """One row of I: names ``a`` and ``b`` identified for op ``op`` by the rule at file:line."""

    a: int
    b: int
    op: int
    file: str
    line: int


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
      invalid: rows of the ``invalid_*`` invariants (empty when the rules are sound).
      stats: counts and seconds per phase.
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
    invalid: tuple[tuple, ...]
    stats: dict[str, Any]

    def dim_name(self, value: str, dim: int) -> int:
        """The dimension name of ``value``'s definition dim ``dim`` (JSON naming)."""
        for value_id, candidate in enumerate(self.program.values):
            if candidate.name == value:
                if not 0 <= dim < len(candidate.shape):
                    raise ToastError(f"{value} has {len(candidate.shape)} dims; no dim {dim}")
                return self.names.def_base[value_id] + dim
        raise ToastError(f"no value named '{value}' (names as in the JSON: argument names, result[N], %N)")

    def color_of_dim(self, value: str, dim: int) -> Color:
        """The color holding ``value``'s dim ``dim``."""
        return self.colors[int(self.color_of[self.dim_name(value, dim)])]


def load_input(source: str, *, args: Sequence[Any] | None = None, fn: Callable[..., Any] | None = None) -> Program:
    """Read ``source``: a ``.mlir`` file, ``module:function`` naming a factory, or ``fn``+``args``."""
    if fn is not None:
        return stablehlo.read_callable(fn, args or (), name=source)
    if source.endswith(".mlir") or Path(source).is_file():
        return stablehlo.read_file(source)
    if ":" not in source:
        raise InputError(f"{source}: not a .mlir file and not module:function")
    module_name, _, attr = source.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InputError(f"{source}: cannot import module '{module_name}': {err}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InputError(f"{source}: module '{module_name}' has no function '{attr}'")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise InputError(f"{source}: the factory must return (function, example_arguments)")
    function, example_args = made
    try:
        return stablehlo.read_callable(function, tuple(example_args), name=source)
    except ToastError:
        raise
    except Exception as err:  # a JAX tracing error in the user's function
        raise InputError(f"{source}: lowering with jax.jit failed: {type(err).__name__}: {str(err).splitlines()[0]}") from None


def pick_engine(engine: EngineName) -> Literal["souffle", "embedded"]:
    """Resolve ``auto`` (Soufflé when on PATH) and validate the name."""
    if engine == "auto":
        return "souffle" if souffle_binary() else "embedded"
    if engine not in ("souffle", "embedded"):
        raise ToastError(f"unknown engine '{engine}' (choose auto, souffle or embedded)")
    return engine


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
) -> Analysis:
    """Run the named-dimension analysis.

    Args:
      source: a ``.mlir`` path, ``module:function`` naming a factory that returns
        ``(fn, example_args)``, a label when ``fn`` is given, or an already read ``Program``.
      fn, args: a JAX callable and example arguments (arrays or ``jax.ShapeDtypeStruct``).
      engine: ``souffle``, ``embedded`` or ``auto`` (Soufflé when installed).
      rules: a directory of user ``.dl`` files extending or overriding the package rules.
      variant: analysis variant name (``rules/variants/<name>.toml``) or a TOML path.
      keep: directory that keeps the facts, the assembled program and the engine outputs.
      timeout_s: limit for the Datalog engine, in seconds.
    """
    chosen = pick_engine(engine)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    program = source if isinstance(source, Program) else load_input(source, args=args, fn=fn)
    timings["read"] = time.perf_counter() - start

    start = time.perf_counter()
    facts, names = program_facts(program)
    timings["facts"] = time.perf_counter() - start

    assembled = assemble(load_variant(variant), user_rules=Path(rules) if rules is not None else None)
    start = time.perf_counter()
    outputs = _evaluate(assembled.text, facts, engine=chosen, keep=Path(keep) if keep else None, timeout_s=timeout_s)
    timings["datalog"] = time.perf_counter() - start

    start = time.perf_counter()
    result = _build(program, names, outputs)
    timings["classes"] = time.perf_counter() - start
    result.stats.update(
        engine=chosen,
        variant=assembled.variant.name,
        seconds={k: round(v, 4) for k, v in timings.items()},
        facts=sum(len(rows) for rows in facts.values()),
    )
    return result


def _evaluate(text: str, facts: dict[str, list[tuple]], *, engine: str, keep: Path | None,
              timeout_s: float) -> dict[str, list[tuple]]:
    """Write the program (and facts) to a working dir and run the chosen engine there."""
    output_types = {r.name: [t for _, t in r.columns] for r in OUTPUTS}
    workdir = Path(tempfile.mkdtemp(prefix="toast-"))
    try:
        program_file = workdir / PROGRAM_NAME
        program_file.write_text(text)
        if engine == "souffle":
            outputs = run_souffle(program_file, facts, output_types, workdir=workdir, timeout_s=timeout_s)
        else:
            from toast.datalog import run_embedded_file

            outputs = run_embedded_file(program_file, facts, list(output_types))
            if keep is not None:
                write_relations(facts, workdir / "facts", suffix=".facts")
                write_relations(outputs, workdir / "out", suffix=".csv")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for item in workdir.iterdir():
                target = keep / item.name
                if target.is_dir():
                    shutil.rmtree(target)
                shutil.move(str(item), target)
        return {name: check_rows(name, rows) for name, rows in outputs.items()}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@functools.lru_cache(maxsize=256)
def display_rule_file(path: str) -> str:
    """A rule file path relative to the project root when it lies inside it."""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path


def _build(program: Program, names: DimensionNames, outputs: dict[str, list[tuple]]) -> Analysis:
    identities = tuple(Identity(a, b, op, display_rule_file(f), line) for a, b, op, f, line in outputs["ident"])
    m_edges = tuple((a, b) for a, b in outputs["m_edge"])
    count = names.count
    node_of = union_find(count, ((i.a, i.b) for i in identities))
    color_label = union_find(count, [(i.a, i.b) for i in identities] + list(m_edges))

    # Colors sorted by size (largest first), ties by smallest member: deterministic ids.
    labels, sizes = np.unique(color_label, return_counts=True)
    order = sorted(range(len(labels)), key=lambda k: (-int(sizes[k]), int(labels[k])))
    color_id_of_label = {int(labels[k]): rank for rank, k in enumerate(order)}
    color_of = np.fromiter((color_id_of_label[int(x)] for x in color_label), dtype=np.int64, count=count)
    members: list[list[DimRef]] = [[] for _ in order]
    for name, (value_id, dim) in enumerate(names.defs):
        value = program.values[value_id]
        members[int(color_of[name])].append(DimRef(value.name, dim, value.shape[dim], value.loc))
    colors = tuple(Color(rank, int(sizes[k]), tuple(members[rank])) for rank, k in enumerate(order))

    unruled = tuple(
        UnruledOp(_op_label(program, op_id), _kind_label(program, op_id, kind), program.ops[op_id].loc)
        for op_id, kind in outputs["unruled_op"]
    )
    invalid = tuple(("invalid_ident_size", *row) for row in outputs["invalid_ident_size"])
    stats = {
        "ops": len(program.ops),
        "values": len(program.values),
        "dimension_names": count,
        "definition_dims": len(names.defs),
        "colors": len(colors),
        "dimension_graph_nodes": int(len(np.unique(node_of))),
        "identities": len(identities),
        "m_edges": len(m_edges),
        "unruled_ops": len(unruled),
    }
    return Analysis(
        program=program,
        names=names,
        colors=colors,
        color_of=color_of,
        node_of=node_of,
        unruled_ops=unruled,
        identities=identities,
        m_edges=m_edges,
        major_factors={int(n): int(s) for n, s in outputs["major_factor"]},
        invalid=invalid,
        stats=stats,
    )


def _op_label(program: Program, op_id: int) -> str:
    op = program.ops[op_id]
    return program.values[op.results[0]].name if op.results else f"op#{op_id}"


def _kind_label(program: Program, op_id: int, kind: str) -> str:
    op = program.ops[op_id]
    if kind == "stablehlo.custom_call":
        return f"stablehlo.custom_call @{op.attr('call_target_name', '?')}"
    return kind
