"""Soufflé-syntax Datalog: preprocessing, parsing, and an embedded engine on pyDatalog.

``parse_file``/``parse_text`` turn ``.dl`` rule files into a checked :class:`Program`;
``run_embedded`` evaluates one on input facts without the ``souffle`` binary.
"""

from toast.datalog.embedded import run_embedded, run_embedded_file
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

__all__ = [
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
