"""Stage 3, datalog: rule programs assembled from variants, run on Soufflé or the embedded engine.

``variants`` assembles a stage's program from a variant and user rules; ``engine.evaluate``
runs it on Soufflé (``souffle``, a subprocess) or on the embedded engine (``embedded``, on
pyDatalog), whose ``preprocess``/``parser`` read the Soufflé subset the rules use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toast.lazy import lazy_names

if TYPE_CHECKING:
    from toast.datalog.embedded import run_embedded, run_embedded_file
    from toast.datalog.engine import EngineName, evaluate, pick_engine
    from toast.datalog.parser import (
        Atom,
        Attribute,
        BinaryOp,
        Clause,
        Constraint,
        Negation,
        NumberConst,
        Program,
        RelationDecl,
        StringConst,
        TypeDecl,
        Variable,
        Wildcard,
        parse_file,
        parse_program,
        parse_text,
    )
    from toast.datalog.preprocess import PreprocessedSource, SourceLocation, preprocess_file, preprocess_text
    from toast.datalog.variants import AssembledProgram, Variant, assemble, known_variants, load_variant

# Public name -> the module that defines it: each loads on first use (the embedded engine's pyDatalog, the
# parser), so reading a cached analysis back imports neither.
_SOURCES: dict[str, str] = {
    **dict.fromkeys(["run_embedded", "run_embedded_file"], "toast.datalog.embedded"),
    **dict.fromkeys(["EngineName", "evaluate", "pick_engine"], "toast.datalog.engine"),
    **dict.fromkeys(["Atom", "Attribute", "BinaryOp", "Clause", "Constraint", "Negation", "NumberConst", "Program",
                     "RelationDecl", "StringConst", "TypeDecl", "Variable", "Wildcard", "parse_file",
                     "parse_program", "parse_text"], "toast.datalog.parser"),
    **dict.fromkeys(["PreprocessedSource", "SourceLocation", "preprocess_file", "preprocess_text"],
                    "toast.datalog.preprocess"),
    **dict.fromkeys(["AssembledProgram", "Variant", "assemble", "known_variants", "load_variant"],
                    "toast.datalog.variants"),
}

__all__ = [
    "AssembledProgram",
    "EngineName",
    "Variant",
    "assemble",
    "evaluate",
    "known_variants",
    "load_variant",
    "pick_engine",
    "Atom",
    "Attribute",
    "BinaryOp",
    "Clause",
    "Constraint",
    "Negation",
    "NumberConst",
    "PreprocessedSource",
    "Program",
    "RelationDecl",
    "SourceLocation",
    "StringConst",
    "TypeDecl",
    "Variable",
    "Wildcard",
    "parse_file",
    "parse_program",
    "parse_text",
    "preprocess_file",
    "preprocess_text",
    "run_embedded",
    "run_embedded_file",
]


__getattr__, __dir__ = lazy_names("toast.datalog", _SOURCES, globals())
