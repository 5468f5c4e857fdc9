"""Evaluate a parsed Soufflé-subset program with pyDatalog (no ``souffle`` binary needed).

pyDatalog evaluates every rule body that joins, negates, compares or computes; this module
drives it stratum by stratum, in the order of :attr:`Program.strata`:

* Every relation is a table (``_Table``) that pyDatalog reads through a Python resolver
  (``pyDatalog.predicate()``, its documented hook): the input facts, the program's constant
  facts and what each stratum derives, answered from hash indexes per pattern of bound
  columns. Asserting rows into pyDatalog's fact store (``pyEngine.assert_``) and retracting
  them after cost as much as the rule bodies (``BENCHMARKS.md``, issue 25).
* A non-recursive stratum is one relation: its rules become pyDatalog clauses of a fresh
  predicate, one query collects everything they derive, and the result becomes the table
  the strata above read. Negation therefore only ever looks at complete lower strata
  (stratified negation). A rule that only copies one relation's columns (one atom, its
  constants selecting rows) is copied in Python; a head that computes (arithmetic, ``cat``,
  ``to_string``) is computed in Python from each answer, as Soufflé computes it once the
  whole body holds.
* A recursive stratum runs semi-naive iterations: each iteration makes the previous
  iteration's new tuples "delta" tables and lets pyDatalog evaluate every rule once per
  recursive atom with that atom reading the delta. pyDatalog's own tabled recursion gives
  the same results but is slow for non-linear rules (``p :- p, p``): its time grows like n⁵
  on a chain of n nodes.

Body literals are reordered before translation (greedily, by estimated matches from the
actual relation sizes and column value counts), since pyDatalog evaluates bodies left to
right, top-down. Comparisons run as soon as their variables are bound, negations once the
lookups that match at most one row are done.

Soufflé semantics kept: set semantics, stratified negation, ``number`` is 32-bit two's
complement and ``unsigned`` 32-bit unsigned (arithmetic wraps), ``/`` and ``%`` truncate
toward zero as in C. Division by zero raises :class:`EngineError` (Soufflé would crash).

A run owns pyDatalog's (per-thread) database: it is cleared before and after each run, so
runs are independent but must not be nested, and the cyclic garbage collector is paused
during the run.
"""

from __future__ import annotations

import collections
import gc
import inspect
import itertools
import operator
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyDatalog import pyDatalog, pyEngine

from toast.datalog.parser import (
    Atom,
    BinaryOp,
    Clause,
    Constraint,
    Expr,
    Functor,
    NumberConst,
    Program,
    RelationDecl,
    StringConst,
    Variable,
    Wildcard,
    parse_file,
)
from toast.datalog.preprocess import SourceLocation
from toast.errors import EngineError

__all__ = ["run_embedded", "run_embedded_file"]

Value = int | str
Row = tuple[Value, ...]

_NUMBER_MIN, _NUMBER_MAX = -(2**31), 2**31 - 1
_UNSIGNED_MAX = 2**32 - 1
_PYDATALOG_COMPARISONS = {"=": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def run_embedded(
    program: Program,
    facts: Mapping[str, Iterable[Sequence[Any]]],
    outputs: Sequence[str] | None = None,
) -> dict[str, list[Row]]:
    """Evaluate ``program`` on ``facts`` and return the ``outputs`` relations as sorted tuples.

    ``facts`` maps ``.input`` relation names to rows (ints for ``number``/``unsigned``
    columns, strs for ``symbol`` columns); relations left out are empty. ``outputs``
    defaults to the program's ``.output`` relations; any declared relation may be asked for.

    Raises:
      EngineError: facts or outputs that do not fit the program, a division by zero, or a
        failure inside pyDatalog.
    """
    wanted = tuple(program.outputs if outputs is None else outputs)
    for name in wanted:
        if name not in program.relations:
            raise EngineError(f"embedded engine: output relation '{name}' is not declared")
    inputs = {name: _input_rows(program, name, rows) for name, rows in facts.items()}
    with _pydatalog_session():
        evaluation = _Evaluation(program, wanted)
        try:
            evaluation.run(inputs)
            return {name: sorted(evaluation.rows(name)) for name in wanted}
        finally:
            evaluation.release()


def run_embedded_file(
    path: str | os.PathLike[str],
    facts: Mapping[str, Iterable[Sequence[Any]]],
    outputs: Sequence[str] | None = None,
    include_dirs: Sequence[str | os.PathLike[str]] = (),
    defines: Mapping[str, str] | None = None,
) -> dict[str, list[Row]]:
    """Preprocess, parse and evaluate the ``.dl`` file at ``path`` (see :func:`run_embedded`)."""
    return run_embedded(parse_file(path, include_dirs, defines), facts, outputs)


# ---------------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------------


def _input_rows(program: Program, name: str, rows: Iterable[Sequence[Any]]) -> set[Row]:
    """Validate and convert the input rows of relation ``name``."""
    decl = program.relations.get(name)
    if decl is None:
        raise EngineError(f"embedded engine: facts given for undeclared relation '{name}'")
    if name not in program.inputs:
        raise EngineError(f"embedded engine: facts given for '{name}', which is not an .input relation")
    rows = rows if isinstance(rows, (list, tuple)) else list(rows)
    if _plain_rows(decl, rows):
        return set(map(tuple, rows))
    converters = [_converter(decl, index) for index in range(decl.arity)]
    converted: set[Row] = set()
    for row in rows:
        if len(row) != decl.arity:
            raise EngineError(
                f"embedded engine: row {tuple(row)!r} of '{name}' has {len(row)} values, expected {decl.arity}"
            )
        try:
            # Arity checked just above; zip's strict= keyword would double this hot loop's cost.
            converted.add(tuple(convert(value) for convert, value in zip(converters, row)))  # noqa: B905
        except (TypeError, ValueError) as err:
            raise EngineError(f"embedded engine: row {tuple(row)!r} of '{name}': {err}") from None
    return converted


def _plain_rows(decl: RelationDecl, rows: Sequence[Sequence[Any]]) -> bool:
    """Whether ``rows`` have the arity and each column plain values of its type, in range.

    Checked a column at a time (the common case, facts made by toast); anything else goes through
    the converters, which name the offending row.
    """
    if not rows:
        return True
    if {len(row) for row in rows} != {decl.arity}:
        return False
    for attribute, values in zip(decl.attributes, zip(*rows)):  # noqa: B905 (arity checked above)
        if attribute.base == "symbol":
            if {type(value) for value in values} != {str}:
                return False
            continue
        if {type(value) for value in values} != {int}:
            return False
        low, high = (_NUMBER_MIN, _NUMBER_MAX) if attribute.base == "number" else (0, _UNSIGNED_MAX)
        if not (low <= min(values) and max(values) <= high):
            return False
    return True


def _converter(decl: RelationDecl, index: int) -> Callable[[Any], Value]:
    """A function checking and normalizing one column's values."""
    attribute = decl.attributes[index]
    if attribute.base == "symbol":

        def to_symbol(value: Any) -> str:
            if not isinstance(value, str):
                raise TypeError(f"column '{attribute.name}' is a symbol, got {value!r}")
            return str(value)

        return to_symbol
    low, high = (_NUMBER_MIN, _NUMBER_MAX) if attribute.base == "number" else (0, _UNSIGNED_MAX)

    def to_integer(value: Any) -> int:
        if isinstance(value, bool):
            raise TypeError(f"column '{attribute.name}' is a {attribute.base}, got {value!r}")
        number = operator.index(value)
        if not low <= number <= high:
            raise ValueError(f"{number} is out of range for the {attribute.base} column '{attribute.name}'")
        return number

    return to_integer


# ---------------------------------------------------------------------------------------------
# pyDatalog session and tables
# ---------------------------------------------------------------------------------------------


@contextmanager
def _pydatalog_session() -> Iterator[None]:
    """A clean pyDatalog database for one run, with the cyclic GC paused.

    pyDatalog keeps its database in thread-global state, so it is cleared before and after
    the run; its registry of Python resolvers (which ``pyDatalog.clear`` keeps) is put back as
    it was, so that no table of a run that failed half-way answers for a predicate of the next.
    Evaluation allocates millions of small objects; the cyclic collector would re-scan them
    over and over (about 3x slower and superlinear at 60k facts).
    """
    gc_enabled = gc.isenabled()
    gc.disable()
    pyDatalog.clear()
    resolvers = dict(pyEngine.Python_resolvers)
    try:
        yield
    finally:
        pyEngine.Python_resolvers.clear()
        pyEngine.Python_resolvers.update(resolvers)
        pyDatalog.clear()
        if gc_enabled:
            gc.enable()


class _Table:
    """A relation's rows, read by pyDatalog through a Python resolver, with per-column value counts.

    pyDatalog asks a resolver for the rows matching a literal's constants (its documented
    ``pyDatalog.predicate()`` hook); the table answers from hash indexes built on first use of each
    pattern of bound columns and kept up to date as rows are added. Asserting the rows as pyDatalog
    facts instead costs an index update per column and row on the way in, a retraction per row on
    the way out (to free them without the cyclic collector), and a clause renaming and unification
    per row read: about as much time again as the rule bodies themselves.

    The value counts give the planner how many rows hold a constant and each column's agreement.
    """

    def __init__(self, name: str, arity: int, constants: _Constants) -> None:
        self.pred = pyEngine.Pred(name, arity)
        self.pred.prearity = arity
        self.rows: set[Row] = set()
        # Made on first use (most tables are never read by a rule, or not by the planner) and kept up to date.
        self._columns: list[collections.Counter[Value]] | None = None
        self._agreements: dict[int, float] = {}
        # The rows in one order, and each as a tuple of pyDatalog constants, in the same order.
        self._order: list[Row] | None = None
        self._terms: list[tuple[Any, ...]] = []
        # Per pattern of bound columns: the function of a row giving its key (its bound values: one
        # value, or a tuple of several) and the index from keys to rows (as constants).
        self._indexes: list[tuple[Callable[[Row], Any], dict[Any, list[tuple[Any, ...]]]]] = []
        # Per tuple of the types of the terms pyDatalog asks with: the function answering it.
        self._lookups: dict[tuple[type, ...], Callable[[tuple[Any, ...]], Sequence[tuple[Any, ...]]]] = {}
        self._constants = constants
        lookups = self._lookups

        def matching(*terms: Any) -> Sequence[tuple[Any, ...]]:
            lookup = lookups.get(tuple(map(type, terms)))
            return (lookup or self._lookup(terms))(terms)

        pyDatalog.predicate()(_resolver(self.pred.name, arity, matching))

    def add(self, rows: Iterable[Row]) -> None:
        """Add ``rows`` (not yet present) to the table."""
        rows = list(rows)
        self.rows.update(rows)
        self._agreements.clear()
        if self._columns is not None:
            for counter, values in zip(self._columns, zip(*rows)):  # noqa: B905 (no rows: nothing to count)
                counter.update(values)
        if self._order is not None:
            added = self._as_terms(rows)
            self._order.extend(rows)
            self._terms.extend(added)
            for key_of, index in self._indexes:
                for row, terms in zip(rows, added, strict=True):
                    index.setdefault(key_of(row), []).append(terms)

    def _as_terms(self, rows: Sequence[Row]) -> list[tuple[Any, ...]]:
        constant = self._constants.__getitem__
        return [tuple(map(constant, row)) for row in rows]

    def _lookup(self, terms: tuple[Any, ...]) -> Callable[[tuple[Any, ...]], Sequence[tuple[Any, ...]]]:
        """The function answering queries whose terms have the types of ``terms`` (an index made for it)."""
        if self._order is None:
            self._order = list(self.rows)
            self._terms = self._as_terms(self._order)
        bound = [column for column, term in enumerate(terms) if isinstance(term, pyEngine.Const)]
        everything = self._terms
        if not bound:

            def lookup(terms: tuple[Any, ...]) -> Sequence[tuple[Any, ...]]:
                return everything

        else:
            # One bound column: the key is its value; several: the tuple of their values (itemgetter's way).
            key_of = operator.itemgetter(*bound)
            index: dict[Any, list[tuple[Any, ...]]] = {}
            for row, terms_of_row in zip(self._order, everything, strict=True):
                index.setdefault(key_of(row), []).append(terms_of_row)
            self._indexes.append((key_of, index))
            find = index.get
            if len(bound) == 1:
                (column,) = bound

                def lookup(terms: tuple[Any, ...]) -> Sequence[tuple[Any, ...]]:
                    return find(terms[column].id, ())

            else:

                def lookup(terms: tuple[Any, ...]) -> Sequence[tuple[Any, ...]]:
                    return find(tuple([terms[column].id for column in bound]), ())

        self._lookups[tuple(map(type, terms))] = lookup
        return lookup

    def _counts(self) -> list[collections.Counter[Value]]:
        if self._columns is None:
            self._columns = [collections.Counter(values) for values in zip(*self.rows, strict=True)] or [
                collections.Counter() for _ in range(self.pred.arity)
            ]
        return self._columns

    def agreement(self, column: int) -> float:
        """The chance that two rows drawn at random hold the same value in ``column`` (the sum of the squared
        counts over the squared rows; 1 / distinct values where each is held as often)."""
        if column not in self._agreements:
            counts = self._counts()[column].values()
            self._agreements[column] = sum(count * count for count in counts) / max(len(self.rows), 1) ** 2
        return self._agreements[column]

    def holding(self, column: int, value: Value) -> int:
        """Number of rows whose ``column`` is ``value``."""
        return self._counts()[column][value]

    def drop(self) -> None:
        """Forget the table's resolver."""
        pyEngine.Python_resolvers.pop(self.pred.id, None)
        pyEngine.remove(self.pred)


class _Constants(dict[Value, Any]):
    """One pyDatalog constant per value, shared by every table of a run (pyDatalog compares the constants
    a literal's repeated variable meets by identity)."""

    def __missing__(self, value: Value) -> Any:
        constant = self[value] = pyEngine.Const(value)
        return constant


def _resolver(name: str, arity: int, matching: Callable[..., Sequence[tuple[Any, ...]]]) -> Callable[..., Any]:
    """``matching`` as a pyDatalog resolver of predicate ``name``/``arity``.

    pyDatalog names a resolver by its function's name and counts its parameters; the signature says
    how many there are.
    """

    def resolve(*terms: Any) -> Sequence[tuple[Any, ...]]:
        return matching(*terms)

    resolve.__name__ = name
    parameter = inspect.Parameter.POSITIONAL_OR_KEYWORD
    resolve.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(f"a{column}", parameter) for column in range(arity)]
    )
    return resolve


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------

_Rule = tuple[Clause, Mapping[int, _Table]]
"""A clause to evaluate, with the tables that replace some body atoms' own (by position)."""


class _Evaluation:
    """One run of a program: tables, strata and the pyDatalog queries."""

    def __init__(self, program: Program, wanted: Sequence[str]) -> None:
        self._program = program
        self._counter = itertools.count()
        self._constants = _Constants()
        self._needed = _needed_relations(program, wanted)
        self._tables = {name: self._new_table(name) for name in program.relations if name in self._needed}

    def _new_table(self, relation: str, role: str = "") -> _Table:
        """A table for ``relation`` under a fresh predicate name.

        Soufflé names may contain ``.`` (pyDatalog's class-attribute syntax) and ``?``, so
        pyDatalog names are made up: ``t<n>_<role><relation with other characters as _>``.
        """
        safe = re.sub(r"[^A-Za-z0-9_]", "_", relation)
        arity = self._program.relations[relation].arity
        return _Table(f"t{next(self._counter)}_{role}{safe}", arity, self._constants)

    def rows(self, relation: str) -> set[Row]:
        """All tuples of ``relation``."""
        return self._tables[relation].rows

    def release(self) -> None:
        """Free pyDatalog's copy of every table."""
        for table in self._tables.values():
            table.drop()

    def run(self, inputs: Mapping[str, set[Row]]) -> None:
        """Load the facts, then evaluate the needed strata bottom-up."""
        initial: dict[str, set[Row]] = {name: set(rows) for name, rows in inputs.items() if name in self._needed}
        rules: dict[str, list[Clause]] = {}
        for clause in self._program.clauses:
            relation = clause.head.relation
            if relation not in self._needed:
                continue
            if clause.is_fact and all(isinstance(arg, (NumberConst, StringConst)) for arg in clause.head.args):
                initial.setdefault(relation, set()).add(tuple(_constant(arg) for arg in clause.head.args))
            else:
                rules.setdefault(relation, []).append(clause)
        for relation, rows in initial.items():
            self._tables[relation].add(rows)
        for stratum in self._program.strata:
            if stratum[0] not in self._needed:
                continue
            members = set(stratum)
            clauses = [clause for relation in stratum for clause in rules.get(relation, ())]
            if any(_recursive_atoms(clause, members) for clause in clauses):
                self._fixpoint(stratum, clauses)
            else:
                (relation,) = stratum
                if clauses:
                    derived = self._derive(relation, [(clause, {}) for clause in clauses])
                    self._tables[relation].add(derived - self.rows(relation))

    def _fixpoint(self, stratum: Sequence[str], clauses: Sequence[Clause]) -> None:
        """Semi-naive evaluation of a recursive stratum; pyDatalog evaluates every rule body."""
        members = set(stratum)
        for relation in stratum:
            exits: list[_Rule] = [
                (c, {}) for c in clauses if c.head.relation == relation and not _recursive_atoms(c, members)
            ]
            if exits:
                self._tables[relation].add(self._derive(relation, exits) - self.rows(relation))
        delta = {relation: set(self.rows(relation)) for relation in stratum}
        while any(delta.values()):
            delta_tables: dict[str, _Table] = {}
            for relation, rows in delta.items():
                if rows:
                    delta_tables[relation] = self._new_table(relation, "delta_")
                    delta_tables[relation].add(rows)
            new: dict[str, set[Row]] = {}
            for relation in stratum:
                variants = [
                    (clause, {position: delta_tables[body_relation]})
                    for clause in clauses
                    if clause.head.relation == relation
                    for position, body_relation in _recursive_atoms(clause, members)
                    if body_relation in delta_tables
                ]
                new[relation] = (self._derive(relation, variants) if variants else set()) - self.rows(relation)
            for table in delta_tables.values():
                table.drop()
            for relation, rows in new.items():
                self._tables[relation].add(rows)
            delta = new

    def _derive(self, relation: str, rules: Sequence[_Rule]) -> set[Row]:
        """Everything ``rules`` derive for ``relation``: pyDatalog evaluates the bodies, one query for the
        rules with a plain head and one per rule with computed head arguments (those Python computes from
        each answer, see ``_computed_head``); rules that only copy a table's columns are copied.

        Each rule comes with overrides: body positions whose atom reads another table
        (a semi-naive delta) instead of the relation's own.
        """
        derived: set[Row] = set()
        plain: list[tuple[Clause, list[_Table | None]]] = []
        for clause, overrides in rules:
            copied = _copy(clause, overrides.get(0, self._tables.get(_first_relation(clause))))
            if copied is not None:
                derived |= copied
                continue
            tables = self._body_tables(clause, overrides)
            head = _computed_head(clause)
            if head is None:
                plain.append((clause, tables))
                continue
            variables, compute = head
            try:
                derived.update(map(compute, self._ask(relation, [(clause, tables)], variables)))
            except _DivisionByZero as fault:
                raise EngineError(f"{fault.location}: division by zero in a rule for '{relation}'") from None
        if plain:
            derived.update(self._ask(relation, plain, None))
        return derived

    def _body_tables(self, clause: Clause, overrides: Mapping[int, _Table]) -> list[_Table | None]:
        """The table each body literal reads (None for a comparison)."""
        tables: list[_Table | None] = []
        for position, literal in enumerate(clause.body):
            if isinstance(literal, Constraint):
                tables.append(None)
            else:
                atom = literal if isinstance(literal, Atom) else literal.atom
                tables.append(overrides.get(position, self._tables[atom.relation]))
        return tables

    def _ask(self, relation: str, rules: Sequence[tuple[Clause, list[_Table | None]]],
             head: Sequence[Variable] | None) -> set[Row]:
        """The answers of one pyDatalog query over ``rules``' bodies: their heads' rows, or with ``head`` (one
        rule), the values of those variables."""
        arity = len(head) if head is not None else self._program.relations[relation].arity
        # The rules' head: a predicate of pyDatalog's own, defined by the clauses (a table's resolver would
        # shadow them).
        target = pyEngine.Pred(f"t{next(self._counter)}_new_{re.sub(r'[^A-Za-z0-9_]', '_', relation)}", arity)
        target.prearity = arity
        for clause, tables in rules:
            pyEngine.assert_(_translate(clause, target, tables, head))
        query = pyEngine.Literal(target, [pyEngine.Var(f"$q{i}") for i in range(arity)])
        try:
            answers = query.ask()
        except _DivisionByZero as fault:
            raise EngineError(f"{fault.location}: division by zero in a rule for '{relation}'") from None
        except Exception as err:  # pyDatalog signals its failures with assorted exception types
            raise EngineError(f"embedded engine failed while evaluating '{relation}': {err}") from err
        finally:
            pyEngine.remove(target)
        if answers is True:
            return {()}
        return set(answers or ())


def _computed_head(clause: Clause) -> tuple[list[Variable], Callable[[Row], Row]] | None:
    """For a rule whose head computes (arithmetic, ``cat``, ``to_string``): the body variables the head
    reads, and the function from their values to the head's row. None for a plain head.

    Soufflé computes a head for each row the body accepts; pyDatalog would compute an expression as soon as
    its variables are bound (when it substitutes them), for rows a later atom then drops: twice the time of
    an invariant's rule with no rows, and a division by zero where Soufflé divides nothing.
    """
    if not any(isinstance(arg, (BinaryOp, Functor)) for arg in clause.head.args):
        return None
    names = sorted(set().union(*(_variables(arg) for arg in clause.head.args)))
    location = clause.location

    def compute(values: Row) -> Row:
        bound = dict(zip(names, values, strict=True))
        return tuple(_value_of(arg, bound, location) for arg in clause.head.args)

    return [Variable(name) for name in names], compute


def _value_of(expr: Expr, bound: Mapping[str, Value], location: SourceLocation) -> Value:
    """``expr``'s value for the variables' values ``bound``, as Soufflé computes it."""
    if isinstance(expr, Variable):
        return bound[expr.name]
    if isinstance(expr, (NumberConst, StringConst)):
        return expr.value
    if isinstance(expr, BinaryOp):
        left, right = _value_of(expr.left, bound, location), _value_of(expr.right, bound, location)
        assert isinstance(left, int) and isinstance(right, int)
        return _arithmetic(expr.op, expr.kind, location)(left, right)
    assert isinstance(expr, Functor), f"unexpected head argument {expr!r}"
    parts = [_value_of(arg, bound, location) for arg in expr.args]
    if expr.name == "to_string":
        return _to_string(parts[0])
    return "".join(str(part) for part in parts)


def _first_relation(clause: Clause) -> str:
    literal = clause.body[0] if clause.body else None
    return literal.relation if isinstance(literal, Atom) else ""


def _copy(clause: Clause, table: _Table | None) -> set[Row] | None:
    """What ``clause`` derives if it only copies columns of ``table``, else None.

    Such a rule (one positive atom; each of its arguments a variable of its own, a wildcard or a
    constant the row must hold; a head of those variables and constants) is a selection and a
    projection: Python copies the rows. pyDatalog would spend as much on each row as on a step of a
    join (a unification and a tabled answer, about 9 us).
    """
    if table is None or len(clause.body) != 1 or not isinstance(clause.body[0], Atom):
        return None
    columns: dict[str, int] = {}
    wanted: list[tuple[int, Value]] = []
    for column, arg in enumerate(clause.body[0].args):
        if isinstance(arg, Variable):
            if arg.name in columns:
                return None
            columns[arg.name] = column
        elif isinstance(arg, (NumberConst, StringConst)):
            wanted.append((column, arg.value))
        elif not isinstance(arg, Wildcard):
            return None
    head: list[tuple[bool, Any]] = []  # (from the row, its column) or (a constant, its value)
    for arg in clause.head.args:
        if isinstance(arg, Variable) and arg.name in columns:
            head.append((True, columns[arg.name]))
        elif isinstance(arg, (NumberConst, StringConst)):
            head.append((False, arg.value))
        else:
            return None
    rows: Iterable[Row] = table.rows
    if wanted:
        rows = [row for row in rows if all(row[column] == value for column, value in wanted)]
    if len(head) > 1 and all(from_row for from_row, _ in head):
        return set(map(operator.itemgetter(*[column for _, column in head]), rows))
    return {tuple([row[item] if from_row else item for from_row, item in head]) for row in rows}


def _needed_relations(program: Program, wanted: Sequence[str]) -> set[str]:
    """``wanted`` and every relation they depend on."""
    depends: dict[str, set[str]] = {}
    for clause in program.clauses:
        body = depends.setdefault(clause.head.relation, set())
        for literal in clause.body:
            if not isinstance(literal, Constraint):
                body.add((literal if isinstance(literal, Atom) else literal.atom).relation)
    needed: set[str] = set()
    todo = list(wanted)
    while todo:
        relation = todo.pop()
        if relation not in needed:
            needed.add(relation)
            todo.extend(depends.get(relation, ()))
    return needed


def _recursive_atoms(clause: Clause, members: set[str]) -> list[tuple[int, str]]:
    """Body positions and relations of the positive atoms over relations of the stratum."""
    return [
        (position, literal.relation)
        for position, literal in enumerate(clause.body)
        if isinstance(literal, Atom) and literal.relation in members
    ]


def _constant(expr: Expr) -> Value:
    assert isinstance(expr, (NumberConst, StringConst))
    return expr.value


# ---------------------------------------------------------------------------------------------
# Planning and translation to pyDatalog clauses
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Positive:
    """A positive atom reading ``table``; args are variables, constants or wildcards."""

    table: _Table
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class _Negative:
    """A negated atom over ``table``."""

    table: _Table
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class _Compare:
    """A comparison (``=`` may bind a variable)."""

    op: str
    left: Expr
    right: Expr
    location: SourceLocation


_Goal = _Positive | _Negative | _Compare


class _DivisionByZero(BaseException):
    """Raised by arithmetic inside pyDatalog.

    A BaseException on purpose: pyDatalog catches ``Exception`` while computing
    expressions and would turn it into a value.
    """

    def __init__(self, location: SourceLocation) -> None:
        super().__init__(str(location))
        self.location = location


def _translate(clause: Clause, head_pred: Any, tables: Sequence[_Table | None],
               head: Sequence[Variable] | None = None) -> Any:
    """The pyDatalog clause for ``clause``'s body, deriving into ``head_pred`` its head (plain: variables and
    constants) or, given, the variables ``head``.

    ``tables[i]`` is the table read by body literal ``i`` (None for comparisons).
    """
    temporaries = (f"${n}" for n in itertools.count())
    goals: list[_Goal] = []
    head_args: list[Expr] = list(head if head is not None else clause.head.args)
    assert not any(isinstance(arg, (BinaryOp, Functor)) for arg in head_args), "a computed head is Python's"
    for literal, table in zip(clause.body, tables, strict=True):
        if isinstance(literal, Constraint):
            goals.append(_Compare(literal.op, literal.left, literal.right, literal.location))
            continue
        atom = literal if isinstance(literal, Atom) else literal.atom
        args: list[Expr] = []
        for arg in atom.args:
            if isinstance(arg, (BinaryOp, Functor)):
                temporary = Variable(next(temporaries))
                goals.append(_Compare("=", temporary, arg, atom.location))
                arg = temporary
            args.append(arg)
        assert table is not None
        goals.append(_Positive(table, tuple(args)) if isinstance(literal, Atom) else _Negative(table, tuple(args)))
    planned = _plan(goals)
    if planned is None:
        raise EngineError(f"{clause.location}: embedded engine cannot order the body of this rule")
    terms = _Terms()
    body = [_goal_literal(goal, terms) for goal in planned]
    head_literal = pyEngine.Literal(head_pred, [terms.term(arg) for arg in head_args])
    return pyEngine.Clause(head_literal, body)


def _plan(goals: Sequence[_Goal]) -> list[_Goal] | None:
    """Order ``goals`` for left-to-right evaluation.

    Filters (comparisons, negations) go as early as their variables are bound (negations after
    the atoms expected to match at most one row, which filter more cheaply); among the
    positive atoms the one with the smallest estimated number of matches for the variables
    bound so far goes next. None if some filter never gets its variables bound (the parser's
    grounding check rules that out).
    """
    bound: set[str] = set()
    atoms = [goal for goal in goals if isinstance(goal, _Positive)]
    filters = [goal for goal in goals if not isinstance(goal, _Positive)]
    ordered: list[_Goal] = []
    while True:
        placed = True
        while placed:
            placed = False
            # A negation is a whole subgoal for pyDatalog, a lookup that matches at most one row about
            # as cheap and may filter as well: the lookups go first.
            lookups_left = any(_estimate(atom, bound) <= 1 for atom in atoms)
            for goal in list(filters):
                if lookups_left and isinstance(goal, _Negative):
                    continue
                binds = _binds_when_ready(goal, bound)
                if binds is not None:
                    ordered.append(goal)
                    bound |= binds
                    filters.remove(goal)
                    placed = True
        if not atoms:
            break
        best = min(atoms, key=lambda atom: _estimate(atom, bound))
        atoms.remove(best)
        ordered.append(best)
        bound |= {arg.name for arg in best.args if isinstance(arg, Variable)}
    return None if filters else ordered


def _variables(expr: Expr) -> set[str]:
    if isinstance(expr, Variable):
        return {expr.name}
    if isinstance(expr, BinaryOp):
        return _variables(expr.left) | _variables(expr.right)
    if isinstance(expr, Functor):
        return set().union(*(_variables(arg) for arg in expr.args))
    return set()


def _binds_when_ready(goal: _Goal, bound: set[str]) -> set[str] | None:
    """Variables ``goal`` binds if it can run once ``bound`` are bound, else None."""
    if isinstance(goal, _Negative):
        needed = set().union(*(_variables(arg) for arg in goal.args))
        return set() if needed <= bound else None
    assert isinstance(goal, _Compare)
    left, right = _variables(goal.left), _variables(goal.right)
    if left <= bound and right <= bound:
        return set()
    if goal.op == "=":
        for target, source in ((goal.left, right), (goal.right, left)):
            if isinstance(target, Variable) and target.name not in bound and source <= bound:
                return {target.name}
    return None


def _estimate(atom: _Positive, bound: set[str]) -> float:
    """Estimated matches of ``atom`` given ``bound`` (independent columns).

    A constant matches the rows that hold it. A bound variable's value is unknown when planning: it is taken
    to be drawn as the column's own values are, so it matches rows x ``agreement``: an operand index bound to
    0 matches far more rows than the average over hundreds of indices (calls with many operands) says.
    """
    rows = len(atom.table.rows)
    estimate = float(rows)
    for column, arg in enumerate(atom.args):
        if isinstance(arg, (NumberConst, StringConst)):
            estimate *= atom.table.holding(column, arg.value) / max(rows, 1)
        elif isinstance(arg, Variable) and arg.name in bound:
            estimate *= atom.table.agreement(column)
    return estimate


class _Terms:
    """Builds pyDatalog terms for one clause (one variable object per name)."""

    def __init__(self) -> None:
        self._variables: dict[str, Any] = {}
        self._wildcards = itertools.count()

    def term(self, expr: Expr) -> Any:
        if isinstance(expr, Variable):
            if expr.name not in self._variables:
                self._variables[expr.name] = pyEngine.Var(expr.name)
            return self._variables[expr.name]
        if isinstance(expr, Wildcard):
            return pyEngine.Var(f"$_{next(self._wildcards)}")
        if isinstance(expr, (NumberConst, StringConst)):
            return pyEngine.Const(expr.value)
        raise AssertionError(f"unexpected term {expr!r}")

    def expression(self, expr: Expr, location: SourceLocation) -> Any:
        """A term for ``expr``; arithmetic and functors become pyDatalog operations computed on binding."""
        if isinstance(expr, Functor):
            # pyDatalog calls an operation's function with as many arguments as it declares: cat is
            # folded into two-argument joins.
            parts = [self.expression(arg, location) for arg in expr.args]
            if expr.name == "to_string":
                return pyEngine.Operation(pyEngine.Const(None), _to_string, pyEngine.VarTuple(parts))
            joined = pyEngine.Const("")
            for part in parts:
                joined = pyEngine.Operation(pyEngine.Const(None), _join, pyEngine.VarTuple([joined, part]))
            return joined
        if not isinstance(expr, BinaryOp):
            return self.term(expr)
        function = _arithmetic(expr.op, expr.kind, location)
        operands = pyEngine.VarTuple([self.expression(expr.left, location), self.expression(expr.right, location)])
        return pyEngine.Operation(pyEngine.Const(None), function, operands)


def _goal_literal(goal: _Goal, terms: _Terms) -> Any:
    """The pyDatalog literal for a planned goal."""
    if isinstance(goal, _Positive):
        return pyEngine.Literal(goal.table.pred, [terms.term(arg) for arg in goal.args])
    if isinstance(goal, _Negative):
        return pyEngine.Literal("~" + goal.table.pred.name, [terms.term(arg) for arg in goal.args])
    left = terms.expression(goal.left, goal.location)
    right = terms.expression(goal.right, goal.location)
    return pyEngine.Literal(_PYDATALOG_COMPARISONS[goal.op], [left, right])


def _join(left: str, right: str) -> str:
    """Soufflé's ``cat`` of two symbols."""
    return left + right


def _to_string(value: int | str) -> str:
    """Soufflé's ``to_string``: a number in decimal (a symbol stays itself)."""
    return str(value)


def _arithmetic(op: str, kind: str, location: SourceLocation) -> Callable[[int, int], int]:
    """``op`` with Soufflé's semantics for ``kind`` (32-bit wrap-around, C division)."""
    if kind == "unsigned":

        def wrap(value: int) -> int:
            return value & _UNSIGNED_MAX

    else:

        def wrap(value: int) -> int:
            return ((value - _NUMBER_MIN) & _UNSIGNED_MAX) + _NUMBER_MIN

    if op == "+":
        return lambda a, b: wrap(a + b)
    if op == "-":
        return lambda a, b: wrap(a - b)
    if op == "*":
        return lambda a, b: wrap(a * b)

    def quotient(a: int, b: int) -> int:
        if b == 0:
            raise _DivisionByZero(location)
        result = abs(a) // abs(b)
        return result if (a < 0) == (b < 0) else -result

    if op == "/":
        return lambda a, b: wrap(quotient(a, b))
    assert op == "%"
    return lambda a, b: wrap(a - b * quotient(a, b))
