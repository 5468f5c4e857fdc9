"""A small C-preprocessor subset for Soufflé ``.dl`` rule files.

Soufflé runs its input through ``cpp``; the embedded engine needs the same expansion
without an external tool. Supported:

* ``#include "file"`` (searched relative to the including file, then in each include
  directory) and ``#include <file>`` (include directories only);
* ``#define NAME`` / ``#define NAME value`` (object-like macros), ``#undef NAME``;
* ``#ifdef NAME``, ``#ifndef NAME``, ``#else``, ``#endif`` (nestable), ``#error text``;
* the predefined macros ``__FILE__`` (the string literal of the current file's absolute
  path) and ``__LINE__`` (the current line number in that file).

Macros are expanded outside string literals and comments only. Comments are kept in the
output because the parser reads doc comments. Every output line maps back to the file and
line it came from (:class:`PreprocessedSource`), so later stages can report errors against
the original files.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from toast.errors import RuleError

__all__ = ["PreprocessedSource", "SourceLocation", "preprocess_file", "preprocess_text"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A preprocessing "word": identifiers and pp-numbers, so that ``x1F`` inside ``0x1F`` is
# never mistaken for an identifier.
_WORD = re.compile(r"[A-Za-z0-9_]+")
_DIRECTIVE = re.compile(r"\s*#\s*([A-Za-z_]*)(.*)$")
_SPECIAL = re.compile(r'"|//|/\*')
_BUILTIN_MACROS = ("__FILE__", "__LINE__")


@dataclass(frozen=True)
class SourceLocation:
    """A line in an original (not preprocessed) source file."""

    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class PreprocessedSource:
    """Preprocessor output: the text plus, for each of its lines, where that line came from."""

    text: str
    lines: tuple[SourceLocation, ...]
    """``lines[i]`` is the origin of output line ``i + 1``."""
    files: tuple[tuple[str, str], ...] = ()
    """``(path, text)`` of every file read, in the order read (the file of ``preprocess_file``, then each
    ``#include``d file as often as it is included): all the output depends on besides the text given to
    ``preprocess_text``. The analysis cache keys on them."""

    def location(self, line: int) -> SourceLocation:
        """Origin of 1-based output ``line``; lines past the end map to the last known line."""
        if not self.lines:
            return SourceLocation("<empty>", 1)
        return self.lines[min(max(line, 1), len(self.lines)) - 1]


@dataclass
class _Conditional:
    """One open ``#ifdef``/``#ifndef`` block."""

    line: int
    parent_active: bool
    taking: bool
    seen_else: bool = False


@dataclass
class _State:
    """Mutable preprocessor state shared across included files."""

    include_dirs: tuple[str, ...]
    macros: dict[str, str]
    out_text: list[str] = field(default_factory=list)
    out_lines: list[SourceLocation] = field(default_factory=list)
    stack: list[str] = field(default_factory=list)
    """Real paths of the files currently being included (for cycle detection)."""
    files: list[tuple[str, str]] = field(default_factory=list)
    """``(path, text)`` of every file read."""


def preprocess_file(
    path: str | os.PathLike[str],
    include_dirs: Sequence[str | os.PathLike[str]] = (),
    defines: Mapping[str, str] | None = None,
) -> PreprocessedSource:
    """Preprocess the file at ``path``.

    ``include_dirs`` are searched (in order) after the including file's own directory;
    ``defines`` are macros defined before the first line, like ``cpp -DNAME=value``.
    Raises :class:`RuleError` for unreadable files and malformed directives.
    """
    display = os.fspath(path)
    text = _read(display, None, None)
    return _preprocess(text, display, include_dirs, defines, read=[(display, text)])


def preprocess_text(
    text: str,
    path: str | os.PathLike[str],
    include_dirs: Sequence[str | os.PathLike[str]] = (),
    defines: Mapping[str, str] | None = None,
) -> PreprocessedSource:
    """Preprocess ``text`` as if it were the contents of the file at ``path``.

    ``path`` is used for ``__FILE__``, for error messages and to resolve relative includes.
    """
    return _preprocess(text, os.fspath(path), include_dirs, defines, read=[])


def _preprocess(
    text: str,
    path: str,
    include_dirs: Sequence[str | os.PathLike[str]],
    defines: Mapping[str, str] | None,
    *,
    read: list[tuple[str, str]],
) -> PreprocessedSource:
    """Preprocess ``text`` of the file at ``path``; ``read``: the files read so far (``(path, text)``)."""
    state = _State(
        include_dirs=tuple(os.fspath(d) for d in include_dirs),
        macros=dict(defines or {}),
        files=read,
    )
    _process(path, text, state)
    return PreprocessedSource("\n".join(state.out_text), tuple(state.out_lines), tuple(state.files))


def _read(path: str, including: str | None, line: int | None) -> str:
    """Read a source file, reporting failures against the including directive if any. Only a regular file
    is read: a FIFO would block and a directory is no source."""
    try:
        if stat.S_ISREG(os.stat(path).st_mode):
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        reason = "not a regular file"
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    if including is None:
        raise RuleError(path, None, f"cannot read file: {reason}")
    raise RuleError(including, line, f"cannot read include file '{path}': {reason}")


def _process(path: str, text: str, state: _State) -> None:
    """Preprocess one file's ``text`` into ``state``, recursing into includes."""
    real = os.path.realpath(path)
    state.stack.append(real)
    conditionals: list[_Conditional] = []
    in_comment = False
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for number, line in enumerate(lines, start=1):
        active = not conditionals or conditionals[-1].taking
        directive = None if in_comment else _DIRECTIVE.match(line)
        if directive is None:
            segments, in_comment = _split_segments(line, in_comment)
            if active:
                state.out_text.append(_expand_line(segments, path, number, state.macros))
                state.out_lines.append(SourceLocation(path, number))
            continue
        name = directive.group(1)
        segments, in_comment = _split_segments(directive.group(2), False)
        argument = "".join(text for kind, text in segments if kind != "comment").strip()
        if argument.endswith("\\"):
            raise RuleError(path, number, "line continuations in directives are not supported")
        if name in ("ifdef", "ifndef", "if", "elif", "else", "endif"):
            _conditional(name, argument, conditionals, active, state.macros, path, number)
        elif active:
            _directive(name, argument, state, path, number)
    if conditionals:
        raise RuleError(path, conditionals[-1].line, "unterminated #ifdef/#ifndef (missing #endif)")
    state.stack.pop()


def _conditional(
    name: str,
    argument: str,
    conditionals: list[_Conditional],
    active: bool,
    macros: Mapping[str, str],
    path: str,
    line: int,
) -> None:
    """Apply a conditional-compilation directive to the ``conditionals`` stack.

    ``#if`` and ``#elif`` are not supported, but inside a skipped block they only need to
    nest correctly, as in cpp.
    """
    if name == "if" or (name == "elif" and (not conditionals or conditionals[-1].parent_active)):
        if active or name == "elif":
            raise RuleError(path, line, f"unsupported preprocessor directive '#{name}'")
        conditionals.append(_Conditional(line=line, parent_active=False, taking=False))
        return
    if name == "elif":
        return
    if name in ("ifdef", "ifndef"):
        macro = _macro_name(name, argument, path, line)
        defined = macro in macros or macro in _BUILTIN_MACROS
        taking = active and (defined if name == "ifdef" else not defined)
        conditionals.append(_Conditional(line=line, parent_active=active, taking=taking))
        return
    if not conditionals:
        raise RuleError(path, line, f"#{name} without matching #ifdef/#ifndef")
    if argument and name == "else":
        raise RuleError(path, line, "unexpected text after #else")
    top = conditionals[-1]
    if name == "else":
        if top.seen_else:
            raise RuleError(path, line, "#else after #else")
        top.seen_else = True
        top.taking = top.parent_active and not top.taking
    else:
        conditionals.pop()


def _directive(name: str, argument: str, state: _State, path: str, line: int) -> None:
    """Apply an (active) non-conditional directive."""
    if name == "":
        if argument:
            raise RuleError(path, line, f"invalid preprocessor directive '#{argument.split()[0]}'")
    elif name == "include":
        _include(argument, state, path, line)
    elif name == "define":
        match = _IDENTIFIER.match(argument)
        if match is None:
            raise RuleError(path, line, "#define requires a macro name")
        macro = match.group(0)
        rest = argument[match.end() :]
        if rest.startswith("("):
            raise RuleError(path, line, f"function-like macro '{macro}' is not supported")
        if rest and not rest[0].isspace():
            raise RuleError(path, line, f"expected whitespace after macro name '{macro}'")
        if macro in _BUILTIN_MACROS:
            raise RuleError(path, line, f"cannot redefine '{macro}'")
        state.macros[macro] = rest.strip()
    elif name == "undef":
        state.macros.pop(_macro_name(name, argument, path, line), None)
    elif name == "error":
        raise RuleError(path, line, f"#error {argument}".rstrip())
    else:
        raise RuleError(path, line, f"unsupported preprocessor directive '#{name}'")


def _macro_name(directive: str, argument: str, path: str, line: int) -> str:
    """The single identifier argument of ``#ifdef``, ``#ifndef`` or ``#undef``."""
    if _IDENTIFIER.fullmatch(argument) is None:
        raise RuleError(path, line, f"#{directive} requires a single macro name")
    return argument


def _include(argument: str, state: _State, path: str, line: int) -> None:
    """Resolve and process an ``#include`` directive."""
    match = re.fullmatch(r'"([^"]+)"|<([^>]+)>', argument)
    if match is None:
        raise RuleError(path, line, '#include expects "file" or <file>')
    quoted, angled = match.group(1), match.group(2)
    name = quoted if quoted is not None else angled
    candidates = [os.path.join(d, name) for d in state.include_dirs]
    if quoted is not None:
        candidates.insert(0, os.path.join(os.path.dirname(path), name))
    resolved = next((os.path.normpath(c) for c in candidates if os.path.isfile(c)), None)
    if resolved is None:
        raise RuleError(path, line, f"cannot find include file '{name}'")
    real = os.path.realpath(resolved)
    if real in state.stack:
        cycle = state.stack[state.stack.index(real) :] + [real]
        chain = " -> ".join(os.path.basename(p) for p in cycle)
        raise RuleError(path, line, f"include cycle: {chain}")
    text = _read(resolved, path, line)
    state.files.append((resolved, text))
    _process(resolved, text, state)


def _split_segments(line: str, in_comment: bool) -> tuple[list[tuple[str, str]], bool]:
    """Split ``line`` into ``("code" | "string" | "comment", text)`` segments.

    ``in_comment`` says whether the line starts inside a ``/* */`` block; the returned flag
    says whether it ends inside one.
    """
    segments: list[tuple[str, str]] = []
    position = 0
    length = len(line)
    while position < length:
        if in_comment:
            end = line.find("*/", position)
            if end < 0:
                segments.append(("comment", line[position:]))
                return segments, True
            segments.append(("comment", line[position : end + 2]))
            position = end + 2
            in_comment = False
            continue
        special = _SPECIAL.search(line, position)
        stop = special.start() if special else length
        if stop > position:
            segments.append(("code", line[position:stop]))
        position = stop
        if position >= length:
            break
        if line.startswith("//", position):
            segments.append(("comment", line[position:]))
            break
        if line.startswith("/*", position):
            end = line.find("*/", position + 2)
            if end < 0:
                segments.append(("comment", line[position:]))
                return segments, True
            segments.append(("comment", line[position : end + 2]))
            position = end + 2
            continue
        end = position + 1
        while end < length and line[end] != '"':
            end += 2 if line[end] == "\\" else 1
        segments.append(("string", line[position : end + 1]))
        position = end + 1
    return segments, in_comment


def _expand_line(segments: list[tuple[str, str]], path: str, line: int, macros: Mapping[str, str]) -> str:
    """Reassemble a line, expanding macros in its code segments."""
    builtins = {"__FILE__": _string_literal(os.path.abspath(path)), "__LINE__": str(line)}
    return "".join(_expand(text, macros, builtins, frozenset()) if kind == "code" else text for kind, text in segments)


def _expand(text: str, macros: Mapping[str, str], builtins: Mapping[str, str], disabled: frozenset[str]) -> str:
    """Expand object-like macros in ``text``; a macro is never re-expanded inside itself."""

    def replace(match: re.Match[str]) -> str:
        word = match.group(0)
        if word in builtins:
            return builtins[word]
        if word in macros and word not in disabled:
            return _expand(macros[word], macros, builtins, disabled | {word})
        return word

    return _WORD.sub(replace, text)


def _string_literal(value: str) -> str:
    """``value`` as a Soufflé string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
