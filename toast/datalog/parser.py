"""Parser and checker for the Soufflé subset run by the embedded engine.

The input is preprocessor output (:class:`~toast.datalog.preprocess.PreprocessedSource`); every
error is reported as :class:`RuleError` against the original file and line through its source
map. Supported:

* ``.type T <: B``, ``.type T = B``, ``.type T = A | B`` (same base type), ``.number_type T``,
  ``.symbol_type T`` over the primitive types ``number``, ``unsigned`` and ``symbol``;
* ``.decl rel(col: type, ...)`` (optionally followed by ``input``/``output``/``btree``/``brie``),
  with the doc comment written right before it;
* ``.input a, b`` / ``.output a(IO=file, ...)`` (the parameters are accepted and ignored);
* facts and rules, several heads per rule, bodies with ``,`` and ``;`` (also in parentheses),
  atoms, negated atoms, ``_``, comparisons ``= != < <= > >=``, ``+ - * / %`` arithmetic and the
  symbol functors ``cat(s, ...)`` and ``to_string(n)`` (for the ``invalid`` checks' details).

Besides syntax, the checker rejects what Soufflé rejects: undeclared or twice-declared
relations, arity mismatches, unknown types, ungrounded variables, type errors and
non-stratifiable negation. Types are checked as Soufflé checks subtypes: a variable that two
positive atoms give incomparable types (an ``OpId`` and a ``ValueId`` column), or a comparison
joins, is an error, and so is a head argument whose type is not a subtype of its column's.
Other Soufflé features (aggregates, functors, records, components,
...) are reported as "not supported by the embedded engine".
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from toast.datalog.preprocess import PreprocessedSource, SourceLocation, preprocess_file, preprocess_text
from toast.errors import RuleError

__all__ = [
    "Atom",
    "Attribute",
    "BinaryOp",
    "Clause",
    "Functor",
    "Constraint",
    "Expr",
    "Literal",
    "Negation",
    "NumberConst",
    "Program",
    "RelationDecl",
    "StringConst",
    "TypeDecl",
    "Variable",
    "Wildcard",
    "parse_file",
    "parse_program",
    "parse_text",
]

PRIMITIVE_TYPES = ("number", "unsigned", "symbol")
NUMBER_RANGE = (-(2**31), 2**31 - 1)
UNSIGNED_RANGE = (0, 2**32 - 1)
_COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")
_ARITHMETIC = ("+", "-", "*", "/", "%")

# ---------------------------------------------------------------------------------------------
# Program model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variable:
    """A named variable."""

    name: str


@dataclass(frozen=True)
class Wildcard:
    """The anonymous variable ``_``; every occurrence is a distinct variable."""


@dataclass(frozen=True)
class NumberConst:
    """An integer constant (``number`` or ``unsigned``)."""

    value: int


@dataclass(frozen=True)
class StringConst:
    """A ``symbol`` constant (escape sequences already decoded)."""

    value: str


@dataclass(frozen=True)
class BinaryOp:
    """Arithmetic ``left op right``; ``kind`` is ``"number"`` or ``"unsigned"`` (set by the checker)."""

    op: str
    left: Expr
    right: Expr
    kind: str = "number"


@dataclass(frozen=True)
class Functor:
    """A symbol functor: ``cat(args...)`` (concatenation of symbols) or ``to_string(arg)`` (a number's
    decimal text)."""

    name: str
    args: tuple[Expr, ...]


# The functors the embedded engine runs: name -> the type of their arguments (None: any; Soufflé's to_string of
# a symbol is the symbol).
FUNCTORS = {"cat": "symbol", "to_string": None}

Expr = Variable | Wildcard | NumberConst | StringConst | BinaryOp | Functor


@dataclass(frozen=True)
class Atom:
    """``relation(args...)``."""

    relation: str
    args: tuple[Expr, ...]
    location: SourceLocation


@dataclass(frozen=True)
class Negation:
    """``!atom``."""

    atom: Atom

    @property
    def location(self) -> SourceLocation:
        """Where the negated atom is written."""
        return self.atom.location


@dataclass(frozen=True)
class Constraint:
    """A comparison ``left op right`` with ``op`` one of ``= != < <= > >=``."""

    op: str
    left: Expr
    right: Expr
    location: SourceLocation


Literal = Atom | Negation | Constraint


@dataclass(frozen=True)
class Clause:
    """A rule ``head :- body.``, or a fact when ``body`` is empty."""

    head: Atom
    body: tuple[Literal, ...]
    location: SourceLocation

    @property
    def is_fact(self) -> bool:
        """True for a clause without body."""
        return not self.body


@dataclass(frozen=True)
class TypeDecl:
    """A user-defined type; ``base`` is the primitive type it resolves to."""

    name: str
    base: str
    location: SourceLocation


@dataclass(frozen=True)
class Attribute:
    """A relation column: its name, declared type and primitive base type."""

    name: str
    type: str
    base: str


@dataclass(frozen=True)
class RelationDecl:
    """A ``.decl`` with its doc comment (``""`` if none)."""

    name: str
    attributes: tuple[Attribute, ...]
    doc: str
    location: SourceLocation

    @property
    def arity(self) -> int:
        """Number of columns."""
        return len(self.attributes)


@dataclass(frozen=True)
class Program:
    """A parsed and checked program."""

    types: Mapping[str, TypeDecl]
    relations: Mapping[str, RelationDecl]
    """Declared relations, in declaration order."""
    clauses: tuple[Clause, ...]
    """Facts and rules in source order (disjunctions and multi-head rules split up)."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    strata: tuple[tuple[str, ...], ...]
    """Strongly connected components of the dependency graph, dependencies first."""


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def parse_file(
    path: str | os.PathLike[str],
    include_dirs: Sequence[str | os.PathLike[str]] = (),
    defines: Mapping[str, str] | None = None,
) -> Program:
    """Preprocess and parse the ``.dl`` file at ``path``."""
    return parse_program(preprocess_file(path, include_dirs, defines))


def parse_text(
    text: str,
    path: str | os.PathLike[str] = "<string>",
    include_dirs: Sequence[str | os.PathLike[str]] = (),
    defines: Mapping[str, str] | None = None,
) -> Program:
    """Preprocess and parse ``text`` as if read from ``path``."""
    return parse_program(preprocess_text(text, path, include_dirs, defines))


def parse_program(source: PreprocessedSource) -> Program:
    """Parse and check preprocessed source."""
    return _Checker(_Parser(source).parse()).check()


# ---------------------------------------------------------------------------------------------
# Lexer
# ---------------------------------------------------------------------------------------------

_DIRECTIVES = frozenset(
    "decl type input output printsize limitsize comp init functor pragma plan override "
    "number_type symbol_type include once debug_delta".split()
)
_AGGREGATES = frozenset("count sum min max mean range".split())
_INFIX_KEYWORDS = frozenset("band bor bxor bshl bshr bshru land lor lxor".split())
_PREFIX_KEYWORDS = frozenset("bnot lnot".split())
_OTHER_KEYWORDS = frozenset(
    "cat ord strlen substr to_float to_number to_string to_unsigned autoinc match contains "
    "nil as true false __ITERATION__ __INCL__".split()
)
_DECL_QUALIFIERS = frozenset(
    "input output btree brie btree_delete eqrel inline no_inline magic no_magic printsize overridable choice".split()
)
_STORAGE_QUALIFIERS = frozenset(("btree", "brie"))

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<open_comment>/\*)
  | (?P<directive>\.[A-Za-z_?][A-Za-z0-9_?]*)
  | (?P<float>[0-9]+\.[0-9]+)
  | (?P<number>0[xX][0-9a-fA-F]+|0[bB][01]+|[0-9]+)(?P<suffix>[A-Za-z_?][A-Za-z0-9_?]*)?
  | (?P<ident>[A-Za-z?_][A-Za-z0-9_?]*(?:\.[A-Za-z?_][A-Za-z0-9_?]*)*)
  | (?P<string>"(?:\\.|[^"\\\n])*")
  | (?P<open_string>")
  | (?P<punct>:-|<:|<=|>=|!=|[(),.:;=<>!+\-*/%|\[\]{}@$^])
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


@dataclass(frozen=True)
class _Token:
    """A lexical token; ``line`` is a line of the preprocessed text."""

    kind: str
    """``ident``, ``wildcard``, ``number``, ``string``, ``directive``, ``punct`` or ``eof``."""
    text: str
    line: int
    start: int
    end: int
    value: int | str | None = None


@dataclass(frozen=True)
class _Comment:
    """A comment with the preprocessed lines it spans."""

    text: str
    first_line: int
    last_line: int
    start: int


class _SyntaxError(Exception):
    """A parse failure at token ``index`` (converted to :class:`RuleError` at the top)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


class _Lexer:
    """Splits preprocessed text into tokens and comments."""

    def __init__(self, source: PreprocessedSource) -> None:
        self.source = source
        text = source.text
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line_of(self, offset: int) -> int:
        """1-based preprocessed line containing ``offset``."""
        return bisect.bisect_right(self._line_starts, offset)

    def error(self, offset: int, message: str) -> RuleError:
        """A :class:`RuleError` at ``offset``, located through the source map."""
        location = self.source.location(self.line_of(offset))
        return RuleError(location.path, location.line, message)

    def tokenize(self) -> tuple[list[_Token], list[_Comment]]:
        """All tokens (ending with an ``eof`` token) and all comments."""
        text = self.source.text
        tokens: list[_Token] = []
        comments: list[_Comment] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None:
                raise self.error(position, f"unexpected character '{text[position]}'")
            kind = match.lastgroup
            assert kind is not None
            start, end = match.start(), match.end()
            if kind == "suffix":  # the last group matched is the number's suffix
                if match.group("suffix") == "u":
                    raise self.error(start, f"not supported by the embedded engine: unsigned literal {match.group(0)}")
                raise self.error(start, f"invalid number '{match.group(0)}'")
            token_text = match.group(0)
            line = self.line_of(start)
            if kind == "comment":
                comments.append(_Comment(token_text, line, self.line_of(end - 1), start))
            elif kind == "open_comment":
                raise self.error(start, "unterminated comment")
            elif kind == "open_string":
                raise self.error(start, "unterminated string literal")
            elif kind == "float":
                raise self.error(start, f"not supported by the embedded engine: float constant {token_text}")
            elif kind == "number":
                tokens.append(_Token("number", token_text, line, start, end, _integer(token_text)))
            elif kind == "string":
                tokens.append(_Token("string", token_text, line, start, end, self._unescape(token_text, start)))
            elif kind == "ident":
                tokens.append(_Token("wildcard" if token_text == "_" else "ident", token_text, line, start, end))
            elif kind == "directive":
                tokens.extend(self._directive_or_dot(token_text, line, start))
            elif kind == "punct":
                tokens.append(_Token("punct", token_text, line, start, end))
            position = end
        end_line = self.line_of(len(text))
        tokens.append(_Token("eof", "end of file", end_line, len(text), len(text)))
        return tokens, comments

    def _directive_or_dot(self, text: str, line: int, start: int) -> list[_Token]:
        """``.decl`` and friends, or a clause-ending ``.`` followed by an identifier."""
        if text[1:] in _DIRECTIVES:
            return [_Token("directive", text, line, start, start + len(text))]
        word = text[1:]
        tokens = [_Token("punct", ".", line, start, start + 1)]
        if word == "_":
            tokens.append(_Token("wildcard", word, line, start + 1, start + len(text)))
        else:
            tokens.append(_Token("ident", word, line, start + 1, start + len(text)))
        return tokens

    def _unescape(self, literal: str, start: int) -> str:
        """Decode a string literal's escape sequences as Soufflé does."""
        body = literal[1:-1]
        if "\\" not in body:
            return body
        out: list[str] = []
        index = 0
        while index < len(body):
            char = body[index]
            if char == "\\":
                escaped = body[index + 1]
                if escaped not in _ESCAPES:
                    raise self.error(start, f"unknown escape sequence \\{escaped}")
                out.append(_ESCAPES[escaped])
                index += 2
            else:
                out.append(char)
                index += 1
        return "".join(out)


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RawType:
    """A ``.type`` declaration before resolution: its primitive or user-type parents (``union``: the
    members of ``.type T = A | B``, which are subtypes of it, not supertypes)."""

    name: str
    parents: tuple[str, ...]
    location: SourceLocation
    union: bool = False


@dataclass(frozen=True)
class _RawDecl:
    """A ``.decl`` before its column types are resolved."""

    name: str
    columns: tuple[tuple[str, str], ...]
    doc: str
    location: SourceLocation


@dataclass(frozen=True)
class _RawProgram:
    """Everything the parser collected, before semantic checks."""

    types: tuple[_RawType, ...]
    decls: tuple[_RawDecl, ...]
    clauses: tuple[Clause, ...]
    inputs: tuple[tuple[str, SourceLocation], ...]
    outputs: tuple[tuple[str, SourceLocation], ...]


_Dnf = list[list[Literal]]
"""A body in disjunctive normal form: a list of alternative conjunctions."""


class _Parser:
    """Recursive-descent parser producing a :class:`_RawProgram`."""

    def __init__(self, source: PreprocessedSource) -> None:
        self._lexer = _Lexer(source)
        self._source = source
        self._tokens, self._comments = self._lexer.tokenize()
        self._comment_starts = [c.start for c in self._comments]
        self._pos = 0
        self._types: list[_RawType] = []
        self._decls: list[_RawDecl] = []
        self._clauses: list[Clause] = []
        self._inputs: list[tuple[str, SourceLocation]] = []
        self._outputs: list[tuple[str, SourceLocation]] = []

    # -- helpers --------------------------------------------------------------------------

    def _peek(self, ahead: int = 0) -> _Token:
        """The token ``ahead`` positions on (the ``eof`` token past the end)."""
        return self._tokens[min(self._pos + ahead, len(self._tokens) - 1)]

    def _next(self) -> _Token:
        """Consume and return the current token."""
        token = self._peek()
        self._pos = min(self._pos + 1, len(self._tokens) - 1)
        return token

    def _at(self, text: str, ahead: int = 0) -> bool:
        """Whether the token ``ahead`` positions on is the punctuation ``text``."""
        token = self._peek(ahead)
        return token.kind == "punct" and token.text == text

    def _accept(self, text: str) -> bool:
        """Consume the punctuation ``text`` if it is next."""
        if self._at(text):
            self._next()
            return True
        return False

    def _fail(self, message: str, index: int | None = None) -> _SyntaxError:
        """A syntax error at token ``index`` (default: the current token)."""
        return _SyntaxError(self._pos if index is None else index, message)

    def _describe(self, token: _Token) -> str:
        """How ``token`` reads in an error message."""
        return "end of file" if token.kind == "eof" else f"'{token.text}'"

    def _expect(self, text: str, context: str) -> _Token:
        """Consume the punctuation ``text`` or fail, naming ``context``."""
        if not self._at(text):
            raise self._fail(f"expected '{text}' {context}, found {self._describe(self._peek())}")
        return self._next()

    def _expect_ident(self, what: str) -> _Token:
        """Consume an identifier or fail, naming ``what`` was expected."""
        token = self._peek()
        if token.kind != "ident":
            raise self._fail(f"expected {what}, found {self._describe(token)}")
        return self._next()

    def _location(self, token: _Token) -> SourceLocation:
        """Where ``token`` is in the original files."""
        return self._source.location(token.line)

    def _unsupported(self, what: str, index: int | None = None) -> _SyntaxError:
        """The error for a Soufflé feature the embedded engine lacks."""
        return self._fail(f"not supported by the embedded engine: {what}", index)

    # -- top level ------------------------------------------------------------------------

    def parse(self) -> _RawProgram:
        """Parse the whole token stream."""
        try:
            while self._peek().kind != "eof":
                self._item()
        except _SyntaxError as err:
            # An unexpected end of file is reported where the unfinished construct stops,
            # which may be inside an included file.
            index = err.index - 1 if self._tokens[err.index].kind == "eof" and err.index > 0 else err.index
            location = self._location(self._tokens[index])
            raise RuleError(location.path, location.line, err.message) from None
        return _RawProgram(
            tuple(self._types), tuple(self._decls), tuple(self._clauses), tuple(self._inputs), tuple(self._outputs)
        )

    def _item(self) -> None:
        """item := directive | clause"""
        token = self._peek()
        if token.kind == "directive":
            self._directive()
        elif token.kind == "ident":
            self._clause()
        else:
            raise self._fail(f"expected a declaration, fact or rule, found {self._describe(token)}")

    def _directive(self) -> None:
        """A ``.decl``, ``.type``, ``.input`` or ``.output`` directive; others are unsupported."""
        token = self._next()
        name = token.text[1:]
        if name == "decl":
            self._decl(token)
        elif name in ("type", "number_type", "symbol_type"):
            self._type(token)
        elif name in ("input", "output"):
            self._io(token)
        else:
            unsupported = {
                "comp": "components (.comp)",
                "init": "component instantiation (.init)",
                "functor": "user-defined functors (.functor)",
                "include": ".include (use #include)",
            }
            raise self._unsupported(unsupported.get(name, f"directive {token.text}"), self._pos - 1)

    def _type(self, token: _Token) -> None:
        """``.type T <: B``, ``.type T = A | B``, ``.number_type T`` or ``.symbol_type T``."""
        location = self._location(token)
        name = self._expect_ident("a type name").text
        if token.text != ".type":
            self._types.append(_RawType(name, ("number" if token.text == ".number_type" else "symbol",), location))
            return
        if self._accept("<:"):
            self._types.append(_RawType(name, (self._type_name(),), location))
            return
        self._expect("=", f"or '<:' after type name '{name}'")
        if self._at("["):
            raise self._unsupported("record types")
        parents = [self._type_name()]
        if self._at("{"):
            raise self._unsupported("algebraic data types")
        while self._accept("|"):
            parents.append(self._type_name())
            if self._at("{"):
                raise self._unsupported("algebraic data types")
        self._types.append(_RawType(name, tuple(parents), location, union=True))

    def _type_name(self) -> str:
        """A type name (``float`` is unsupported)."""
        token = self._expect_ident("a type name")
        if token.text == "float":
            raise self._unsupported("type float", self._pos - 1)
        return token.text

    def _decl(self, token: _Token) -> None:
        """``.decl name(attr: type, ...) qualifiers``, with the doc comment before it."""
        doc = self._doc_comment(self._pos - 1)
        name_token = self._expect_ident("a relation name")
        if self._at(","):
            raise self._unsupported("several relations in one .decl")
        self._expect("(", f"after relation name '{name_token.text}'")
        columns: list[tuple[str, str]] = []
        if not self._at(")"):
            while True:
                column = self._expect_ident("an attribute name").text
                self._expect(":", f"after attribute '{column}'")
                if self._at("["):
                    raise self._unsupported("record types")
                columns.append((column, self._type_name()))
                if not self._accept(","):
                    break
        self._expect(")", f"after the attributes of '{name_token.text}'")
        while self._peek().kind == "ident" and self._peek().text in _DECL_QUALIFIERS:
            qualifier = self._next()
            if qualifier.text == "input":
                self._inputs.append((name_token.text, self._location(qualifier)))
            elif qualifier.text == "output":
                self._outputs.append((name_token.text, self._location(qualifier)))
            elif qualifier.text not in _STORAGE_QUALIFIERS:
                raise self._unsupported(f"relation qualifier '{qualifier.text}'", self._pos - 1)
        self._decls.append(_RawDecl(name_token.text, tuple(columns), doc, self._location(name_token)))

    def _io(self, token: _Token) -> None:
        """``.input``/``.output`` ``name, ...`` with optional (ignored) parameters."""
        target = self._inputs if token.text == ".input" else self._outputs
        while True:
            name = self._expect_ident(f"a relation name after {token.text}")
            target.append((name.text, self._location(name)))
            if not self._accept(","):
                break
        if self._at("("):
            self._skip_parameters()

    def _skip_parameters(self) -> None:
        """Skip an IO parameter list ``(key=value, ...)``; the embedded engine ignores it."""
        opening = self._pos
        depth = 0
        while True:
            token = self._next()
            if token.kind == "eof":
                raise self._fail("unterminated parameter list", opening)
            if token.kind == "punct" and token.text == "(":
                depth += 1
            elif token.kind == "punct" and token.text == ")":
                depth -= 1
                if depth == 0:
                    return

    def _doc_comment(self, index: int) -> str:
        """The comment block written directly before token ``index`` (``""`` if none)."""
        token = self._tokens[index]
        previous = self._tokens[index - 1] if index > 0 else None
        first = bisect.bisect_left(self._comment_starts, previous.end if previous else 0)
        last = bisect.bisect_left(self._comment_starts, token.start)
        # A comment on the line of the previous token trails that token.
        block = [c for c in self._comments[first:last] if previous is None or c.first_line > previous.line]
        if not block or block[-1].last_line < token.line - 1:
            return ""
        if block[-1].text.startswith("/*"):
            return _clean_block_comment(block[-1].text)
        lines: list[str] = []
        expected = block[-1].first_line
        for comment in reversed(block):
            if comment.text.startswith("/*") or comment.first_line != expected:
                break
            lines.append(re.sub(r"^//+ ?", "", comment.text).rstrip())
            expected -= 1
        return "\n".join(reversed(lines)).strip()

    # -- clauses --------------------------------------------------------------------------

    def _clause(self) -> None:
        """clause := atom (',' atom)* ('.' | ':-' body '.'), one Clause per head and alternative."""
        first = self._peek()
        location = self._location(first)
        heads = [self._atom()]
        while self._accept(","):
            heads.append(self._atom())
        if self._accept("."):
            self._clauses.extend(Clause(head, (), location) for head in heads)
            return
        if not self._at(":-"):
            raise self._fail(
                f"expected '.' or ':-' after '{heads[-1].relation}(...)', found {self._describe(self._peek())}"
            )
        self._next()
        alternatives = self._disjunction()
        self._expect(".", "at the end of the rule")
        self._clauses.extend(Clause(head, tuple(body), location) for head in heads for body in alternatives)

    def _atom(self) -> Atom:
        """atom := name '(' [expr (',' expr)*] ')'"""
        token = self._expect_ident("a relation name")
        if token.text in _AGGREGATES or token.text in _OTHER_KEYWORDS or token.text in _PREFIX_KEYWORDS:
            raise self._unsupported(f"functor '{token.text}'", self._pos - 1)
        self._expect("(", f"after relation name '{token.text}'")
        args: list[Expr] = []
        if not self._at(")"):
            args.append(self._expression())
            while self._accept(","):
                args.append(self._expression())
        self._expect(")", f"after the arguments of '{token.text}'")
        return Atom(token.text, tuple(args), self._location(token))

    def _disjunction(self) -> _Dnf:
        """body := conjunction (';' conjunction)*"""
        alternatives = self._conjunction()
        while self._accept(";"):
            alternatives = alternatives + self._conjunction()
        return alternatives

    def _conjunction(self) -> _Dnf:
        """conjunction := literal (',' literal)*"""
        alternatives: _Dnf = [[]]
        while True:
            part = self._body_literal()
            alternatives = [left + right for left in alternatives for right in part]
            if not self._accept(","):
                return alternatives

    def _body_literal(self) -> _Dnf:
        """literal := '!' atom | atom | '(' body ')' | constraint"""
        token = self._peek()
        if self._at("!"):
            self._next()
            if self._peek().kind != "ident" or not self._at("(", 1):
                raise self._unsupported("negation of anything but an atom")
            return [[Negation(self._atom())]]
        if token.kind == "ident" and self._at("(", 1) and token.text not in FUNCTORS:
            return [[self._atom()]]
        if self._at("("):
            return self._parenthesized()
        return [[self._constraint()]]

    def _parenthesized(self) -> _Dnf:
        """``( body )`` or a constraint starting with a parenthesized expression."""
        start = self._pos
        try:
            return [[self._constraint()]]
        except _SyntaxError as as_constraint:
            self._pos = start
            try:
                self._next()
                body = self._disjunction()
                self._expect(")", "after the parenthesized body")
                return body
            except _SyntaxError as as_body:
                raise (as_body if as_body.index >= as_constraint.index else as_constraint) from None

    def _constraint(self) -> Constraint:
        """constraint := expr ('=' | '!=' | '<' | '<=' | '>' | '>=') expr"""
        location = self._location(self._peek())
        left = self._expression()
        operator = self._peek()
        if operator.kind != "punct" or operator.text not in _COMPARISONS:
            raise self._fail(f"expected a comparison operator, found {self._describe(operator)}")
        self._next()
        right = self._expression()
        return Constraint(operator.text, left, right, location)

    def _expression(self) -> Expr:
        """expr := term (('+' | '-') term)*"""
        left = self._term()
        while self._peek().kind == "punct" and self._peek().text in ("+", "-"):
            op = self._next().text
            left = BinaryOp(op, left, self._term())
        self._reject_operator()
        return left

    def _term(self) -> Expr:
        """term := unary (('*' | '/' | '%') unary)*"""
        left = self._unary()
        while self._peek().kind == "punct" and self._peek().text in ("*", "/", "%"):
            op = self._next().text
            left = BinaryOp(op, left, self._unary())
        self._reject_operator()
        return left

    def _reject_operator(self) -> None:
        """Fail on a Soufflé binary operator the embedded engine lacks (``band``, ``^``, ...)."""
        token = self._peek()
        if token.kind == "ident" and token.text in _INFIX_KEYWORDS:
            raise self._unsupported(f"operator '{token.text}'")
        if token.kind == "punct" and token.text == "^":
            raise self._unsupported(f"operator '{token.text}'")

    def _unary(self) -> Expr:
        """unary := '-' unary | primary (a negated constant is folded)"""
        if self._accept("-"):
            operand = self._unary()
            if isinstance(operand, NumberConst):
                return NumberConst(-operand.value)
            return BinaryOp("-", NumberConst(0), operand)
        return self._primary()

    def _primary(self) -> Expr:
        """primary := number | string | variable | '_' | '(' expr ')'"""
        token = self._peek()
        if token.kind == "number":
            self._next()
            assert isinstance(token.value, int)
            return NumberConst(token.value)
        if token.kind == "string":
            self._next()
            assert isinstance(token.value, str)
            return StringConst(token.value)
        if token.kind == "wildcard":
            self._next()
            return Wildcard()
        if token.kind == "ident" and token.text in FUNCTORS and self._at("(", 1):
            self._next()
            self._next()
            args = [self._expression()]
            while self._accept(","):
                args.append(self._expression())
            self._expect(")", f"after the arguments of '{token.text}'")
            if token.text == "to_string" and len(args) != 1:
                raise self._fail(f"'to_string' takes one argument, not {len(args)}")
            return Functor(token.text, tuple(args))
        if token.kind == "ident":
            if token.text in _AGGREGATES and not self._at("(", 1):
                raise self._unsupported(f"aggregate '{token.text}'")
            if self._at("(", 1):
                raise self._unsupported(f"functor '{token.text}'")
            if token.text in _OTHER_KEYWORDS or token.text in _PREFIX_KEYWORDS:
                raise self._unsupported(f"'{token.text}'")
            self._next()
            return Variable(token.text)
        if self._accept("("):
            inner = self._expression()
            self._expect(")", "to close the parenthesized expression")
            return inner
        special = {"@": "user-defined functors", "$": "algebraic data types", "[": "records"}
        if token.kind == "punct" and token.text in special:
            raise self._unsupported(special[token.text])
        raise self._fail(f"expected an expression, found {self._describe(token)}")


def _integer(text: str) -> int:
    """Value of a decimal, ``0x`` hexadecimal or ``0b`` binary literal."""
    prefix = text[:2].lower()
    if prefix == "0x":
        return int(text[2:], 16)
    if prefix == "0b":
        return int(text[2:], 2)
    return int(text, 10)


def _clean_block_comment(text: str) -> str:
    """The text of a ``/* */`` or ``/** */`` comment without its markers."""
    body = re.sub(r"^/\*+", "", text)
    body = re.sub(r"\*+/$", "", body)
    lines = [
        re.sub(r"^\s*\* ?", "", line) if line.lstrip().startswith("*") else line.strip() for line in body.split("\n")
    ]
    return "\n".join(line.rstrip() for line in lines).strip()


# ---------------------------------------------------------------------------------------------
# Semantic checks
# ---------------------------------------------------------------------------------------------


def _error(location: SourceLocation, message: str) -> RuleError:
    return RuleError(location.path, location.line, message)


def _variables(expr: Expr) -> Iterator[str]:
    """Names of the variables in ``expr``."""
    if isinstance(expr, Variable):
        yield expr.name
    elif isinstance(expr, BinaryOp):
        yield from _variables(expr.left)
        yield from _variables(expr.right)
    elif isinstance(expr, Functor):
        for arg in expr.args:
            yield from _variables(arg)


def _clause_variables(clause: Clause) -> Iterator[str]:
    """Names of all variables of ``clause`` (with repetitions)."""
    for arg in clause.head.args:
        yield from _variables(arg)
    for literal in clause.body:
        if isinstance(literal, Constraint):
            yield from _variables(literal.left)
            yield from _variables(literal.right)
        else:
            atom = literal if isinstance(literal, Atom) else literal.atom
            for arg in atom.args:
                yield from _variables(arg)


def _has_wildcard(expr: Expr) -> bool:
    if isinstance(expr, Wildcard):
        return True
    if isinstance(expr, Functor):
        return any(_has_wildcard(arg) for arg in expr.args)
    return isinstance(expr, BinaryOp) and (_has_wildcard(expr.left) or _has_wildcard(expr.right))


class _Checker:
    """Resolves names and types and checks a :class:`_RawProgram` like Soufflé's semantic checker."""

    def __init__(self, raw: _RawProgram) -> None:
        self._raw = raw
        self._types: dict[str, TypeDecl] = {}
        self._relations: dict[str, RelationDecl] = {}
        self._supertypes: dict[str, frozenset[str]] = {}

    def check(self) -> Program:
        """Run all checks and build the :class:`Program`."""
        self._resolve_types()
        self._resolve_relations()
        inputs = self._io_names(self._raw.inputs)
        outputs = self._io_names(self._raw.outputs)
        clauses = tuple(self._check_clause(clause) for clause in self._raw.clauses)
        strata = _stratify(self._relations, clauses)
        return Program(self._types, self._relations, clauses, inputs, outputs, strata)

    def _resolve_types(self) -> None:
        """Resolve every ``.type`` to its primitive base type."""
        raw_types: dict[str, _RawType] = {}
        for raw in self._raw.types:
            if raw.name in PRIMITIVE_TYPES or raw.name in raw_types:
                where = (
                    "a primitive type" if raw.name in PRIMITIVE_TYPES else f"declared at {raw_types[raw.name].location}"
                )
                raise _error(raw.location, f"type '{raw.name}' already {where}")
            raw_types[raw.name] = raw
        resolving: list[str] = []

        def base_of(name: str, location: SourceLocation) -> str:
            if name in PRIMITIVE_TYPES:
                return name
            if name in self._types:
                return self._types[name].base
            if name not in raw_types:
                raise _error(location, f"unknown type '{name}'")
            if name in resolving:
                raise _error(raw_types[name].location, f"type '{name}' is defined in terms of itself")
            resolving.append(name)
            raw = raw_types[name]
            bases = {base_of(parent, raw.location) for parent in raw.parents}
            resolving.pop()
            if len(bases) > 1:
                raise _error(raw.location, f"union type '{name}' mixes base types {', '.join(sorted(bases))}")
            self._types[name] = TypeDecl(name, bases.pop(), raw.location)
            return self._types[name].base

        for raw in self._raw.types:
            base_of(raw.name, raw.location)
        # Subtyping: T <: P makes P a supertype of T; T = A | B makes T a supertype of A and B.
        up: dict[str, set[str]] = {name: {decl.base} for name, decl in self._types.items()}
        for raw in self._raw.types:
            for parent in raw.parents:
                if raw.union:
                    up.setdefault(parent, set()).add(raw.name)
                else:
                    up[raw.name].add(parent)
        for name in up:
            reached, frontier = set(), [name]
            while frontier:
                for parent in up.get(frontier.pop(), ()):
                    if parent not in reached:
                        reached.add(parent)
                        frontier.append(parent)
            self._supertypes[name] = frozenset(reached)

    def _resolve_relations(self) -> None:
        """Build the :class:`RelationDecl` of every ``.decl``."""
        for raw in self._raw.decls:
            if raw.name in self._relations:
                previous = self._relations[raw.name].location
                raise _error(raw.location, f"relation '{raw.name}' already declared at {previous}")
            attributes = []
            seen: set[str] = set()
            for column, type_name in raw.columns:
                if column in seen:
                    raise _error(raw.location, f"attribute '{column}' of '{raw.name}' is declared twice")
                seen.add(column)
                if type_name in PRIMITIVE_TYPES:
                    base = type_name
                elif type_name in self._types:
                    base = self._types[type_name].base
                else:
                    raise _error(raw.location, f"unknown type '{type_name}' for attribute '{column}' of '{raw.name}'")
                attributes.append(Attribute(column, type_name, base))
            self._relations[raw.name] = RelationDecl(raw.name, tuple(attributes), raw.doc, raw.location)

    def _io_names(self, entries: tuple[tuple[str, SourceLocation], ...]) -> tuple[str, ...]:
        """The declared, de-duplicated relation names of ``.input``/``.output`` directives."""
        names: list[str] = []
        for name, location in entries:
            if name not in self._relations:
                raise _error(location, f"relation '{name}' is not declared")
            if name not in names:
                names.append(name)
        return tuple(names)

    # -- clauses --------------------------------------------------------------------------

    def _check_clause(self, clause: Clause) -> Clause:
        """Check names, arities, wildcards, grounding and types; returns the annotated clause."""
        atoms = [clause.head] + [
            lit if isinstance(lit, Atom) else lit.atom for lit in clause.body if not isinstance(lit, Constraint)
        ]
        for atom in atoms:
            decl = self._relations.get(atom.relation)
            if decl is None:
                raise _error(atom.location, f"relation '{atom.relation}' is not declared")
            if len(atom.args) != decl.arity:
                raise _error(
                    atom.location,
                    f"'{atom.relation}' has {decl.arity} attribute(s) but is used with {len(atom.args)} argument(s)",
                )
        if any(_has_wildcard(arg) for arg in clause.head.args):
            raise _error(clause.head.location, f"underscore in the head of '{clause.head.relation}'")
        for literal in clause.body:
            if isinstance(literal, Constraint) and (_has_wildcard(literal.left) or _has_wildcard(literal.right)):
                raise _error(literal.location, "underscore in a constraint")
            if isinstance(literal, (Atom, Negation)):
                atom = literal if isinstance(literal, Atom) else literal.atom
                if any(isinstance(arg, (BinaryOp, Functor)) and _has_wildcard(arg) for arg in atom.args):
                    raise _error(atom.location, "underscore in an arithmetic expression")
        self._check_grounded(clause)
        return _Typer(self._relations, clause, self._supertypes).annotate()

    def _check_grounded(self, clause: Clause) -> None:
        """Every variable must be bound by a positive atom or an ``=`` from bound variables."""
        grounded = {
            arg.name
            for literal in clause.body
            if isinstance(literal, Atom)
            for arg in literal.args
            if isinstance(arg, Variable)
        }
        changed = True
        while changed:
            changed = False
            for literal in clause.body:
                if not isinstance(literal, Constraint) or literal.op != "=":
                    continue
                for target, source in ((literal.left, literal.right), (literal.right, literal.left)):
                    if (
                        isinstance(target, Variable)
                        and target.name not in grounded
                        and all(name in grounded for name in _variables(source))
                    ):
                        grounded.add(target.name)
                        changed = True
        uses: list[tuple[Expr, SourceLocation]] = [(arg, clause.head.location) for arg in clause.head.args]
        for literal in clause.body:
            if isinstance(literal, Constraint):
                uses += [(literal.left, literal.location), (literal.right, literal.location)]
            else:
                atom = literal if isinstance(literal, Atom) else literal.atom
                uses += [(arg, atom.location) for arg in atom.args]
        for expr, location in uses:
            for name in _variables(expr):
                if name not in grounded:
                    raise _error(location, f"ungrounded variable '{name}'")


class _Typer:
    """Infers the primitive type of every variable of a clause, checks and annotates its arithmetic."""

    def __init__(self, relations: Mapping[str, RelationDecl], clause: Clause,
                 supertypes: Mapping[str, frozenset[str]]) -> None:
        self._relations = relations
        self._clause = clause
        self._kinds: dict[str, str] = {}
        self._supertypes = supertypes

    def annotate(self) -> Clause:
        """The clause with ``BinaryOp.kind`` filled in; raises :class:`RuleError` on type errors."""
        clause = self._clause
        atoms = [clause.head] + [
            lit if isinstance(lit, Atom) else lit.atom for lit in clause.body if not isinstance(lit, Constraint)
        ]
        for atom in atoms:
            for arg, attribute in zip(atom.args, self._relations[atom.relation].attributes, strict=True):
                if isinstance(arg, Variable):
                    self._bind(arg.name, attribute.base, atom.location)
        self._propagate_equalities()
        for name in _clause_variables(clause):
            self._kinds.setdefault(name, "number")
        head = self._atom(clause.head)
        body: list[Literal] = []
        for literal in clause.body:
            if isinstance(literal, Atom):
                body.append(self._atom(literal))
            elif isinstance(literal, Negation):
                body.append(Negation(self._atom(literal.atom)))
            else:
                body.append(self._constraint(literal))
        self._check_subtypes()  # after the primitive types: their errors say more
        return replace(clause, head=head, body=tuple(body))

    def _is_subtype(self, sub: str, sup: str) -> bool:
        return sub == sup or sup in self._supertypes.get(sub, ())

    def _check_subtypes(self) -> None:
        """Soufflé's subtype rules: the positive atoms a variable occurs in (and the variables a comparison
        joins it to) give it the most specific of their column types, which must exist; a head argument's
        type must be a subtype of its column's. Negations and arithmetic add no constraint."""
        clause = self._clause
        group: dict[str, str] = {}

        def find(name: str) -> str:
            while group.get(name, name) != name:
                name = group[name]
            return name

        for literal in clause.body:
            if isinstance(literal, Constraint) and isinstance(literal.left, Variable) and \
                    isinstance(literal.right, Variable):
                group[find(literal.left.name)] = find(literal.right.name)
        constraints: dict[str, list[tuple[str, str, SourceLocation]]] = {}
        for literal in clause.body:
            if isinstance(literal, Atom):
                for arg, attribute in zip(literal.args, self._relations[literal.relation].attributes, strict=True):
                    if isinstance(arg, Variable):
                        constraints.setdefault(find(arg.name), []).append((attribute.type, arg.name, literal.location))
        deduced: dict[str, str] = {}
        for root, found in constraints.items():
            types = {type_ for type_, _, _ in found}
            best = [t for t in types if all(self._is_subtype(t, other) for other in types)]
            if not best:
                first, name, location = found[0]
                other = next(type_ for type_, _, _ in found if not self._is_subtype(first, type_)
                             and not self._is_subtype(type_, first))
                raise _error(location, f"unable to deduce the type of variable '{name}': it is used as {first} "
                                       f"and as {other}, neither a subtype of the other")
            deduced[root] = best[0]
        head = clause.head
        for arg, attribute in zip(head.args, self._relations[head.relation].attributes, strict=True):
            if isinstance(arg, Variable) and find(arg.name) in deduced:
                actual = deduced[find(arg.name)]
                if not self._is_subtype(actual, attribute.type):
                    raise _error(head.location, f"'{arg.name}' is a {actual}, not a subtype of {attribute.type}, "
                                                f"the type of {head.relation}.{attribute.name}")

    def _bind(self, name: str, kind: str, location: SourceLocation) -> None:
        """Record that variable ``name`` has primitive type ``kind``."""
        known = self._kinds.setdefault(name, kind)
        if known != kind:
            raise _error(location, f"variable '{name}' is used both as {known} and as {kind}")

    def _propagate_equalities(self) -> None:
        """Type variables bound only by ``X = expr`` from the type of ``expr``."""
        changed = True
        while changed:
            changed = False
            for literal in self._clause.body:
                if not isinstance(literal, Constraint) or literal.op != "=":
                    continue
                for target, source in ((literal.left, literal.right), (literal.right, literal.left)):
                    if isinstance(target, Variable) and target.name not in self._kinds:
                        kind = self._kind(source, literal.location)
                        if kind is not None:
                            self._kinds[target.name] = kind
                            changed = True

    def _kind(self, expr: Expr, location: SourceLocation) -> str | None:
        """Primitive type of ``expr``; None for an integer constant (fits number or unsigned)."""
        if isinstance(expr, Variable):
            return self._kinds.get(expr.name)
        if isinstance(expr, StringConst):
            return "symbol"
        if isinstance(expr, Functor):
            wanted = FUNCTORS[expr.name]
            for arg in expr.args:
                kind = self._kind(arg, location)
                if wanted is not None and kind is not None and kind != wanted:
                    raise _error(location, f"'{expr.name}' takes a {wanted}, not a {kind}")
            return "symbol"
        if isinstance(expr, BinaryOp):
            left, right = self._kind(expr.left, location), self._kind(expr.right, location)
            for side in (left, right):
                if side == "symbol":
                    raise _error(location, f"arithmetic '{expr.op}' on a symbol")
            if left is not None and right is not None and left != right:
                raise _error(location, f"arithmetic '{expr.op}' mixes {left} and {right}")
            return left or right
        return None

    def _typed(self, expr: Expr, kind: str, location: SourceLocation) -> Expr:
        """``expr`` checked against ``kind`` with its arithmetic annotated."""
        actual = self._kind(expr, location)
        if actual is not None and actual != kind:
            raise _error(location, f"expected a {kind} but found a {actual}")
        if isinstance(expr, NumberConst):
            if kind == "symbol":
                raise _error(location, f"expected a symbol but found the number {expr.value}")
            low, high = NUMBER_RANGE if kind == "number" else UNSIGNED_RANGE
            if not low <= expr.value <= high:
                raise _error(location, f"number constant {expr.value} is out of range for type {kind}")
        if isinstance(expr, BinaryOp):
            return BinaryOp(
                expr.op, self._typed(expr.left, kind, location), self._typed(expr.right, kind, location), kind
            )
        if isinstance(expr, Functor):
            return Functor(expr.name, tuple(
                self._typed(arg, FUNCTORS[expr.name] or self._kind(arg, location) or "number", location)
                for arg in expr.args))
        return expr

    def _atom(self, atom: Atom) -> Atom:
        """``atom`` with its arguments checked against the column types."""
        columns = self._relations[atom.relation].attributes
        args = tuple(self._typed(arg, column.base, atom.location)
                     for arg, column in zip(atom.args, columns, strict=True))
        return replace(atom, args=args)

    def _constraint(self, constraint: Constraint) -> Constraint:
        """``constraint`` with both sides checked to have one type."""
        location = constraint.location
        left, right = self._kind(constraint.left, location), self._kind(constraint.right, location)
        if left is not None and right is not None and left != right:
            raise _error(location, f"cannot compare a {left} with a {right}")
        kind = left or right or "number"
        if kind == "symbol" and constraint.op not in ("=", "!="):
            raise _error(location, f"not supported by the embedded engine: '{constraint.op}' on symbols")
        return replace(
            constraint,
            left=self._typed(constraint.left, kind, location),
            right=self._typed(constraint.right, kind, location),
        )


def _stratify(relations: Mapping[str, RelationDecl], clauses: Sequence[Clause]) -> tuple[tuple[str, ...], ...]:
    """Strongly connected components of the relation dependency graph, dependencies first.

    Raises :class:`RuleError` when a relation depends negatively on its own component.
    """
    edges: dict[str, list[str]] = {name: [] for name in relations}
    for clause in clauses:
        for literal in clause.body:
            if isinstance(literal, (Atom, Negation)):
                atom = literal if isinstance(literal, Atom) else literal.atom
                edges[clause.head.relation].append(atom.relation)
    components = _tarjan(list(relations), edges)
    component_of = {name: index for index, component in enumerate(components) for name in component}
    for clause in clauses:
        for literal in clause.body:
            if (
                isinstance(literal, Negation)
                and component_of[literal.atom.relation] == component_of[clause.head.relation]
            ):
                cycle = ", ".join(components[component_of[clause.head.relation]])
                raise _error(
                    literal.location,
                    f"cannot stratify: '{clause.head.relation}' depends on the negation of "
                    f"'{literal.atom.relation}' in the recursive cycle {{{cycle}}}",
                )
    return tuple(components)


def _tarjan(nodes: Sequence[str], edges: Mapping[str, Sequence[str]]) -> list[tuple[str, ...]]:
    """Tarjan's algorithm (iterative); components come out dependencies first."""
    order = {name: position for position, name in enumerate(nodes)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[tuple[str, ...]] = []
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            successors = edges[node]
            if child < len(successors):
                work.append((node, child + 1))
                successor = successors[child]
                if successor not in index:
                    work.append((successor, 0))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(tuple(sorted(component, key=order.__getitem__)))
    return components
