"""Analysis variants: which rule files make up the Datalog program, assembled by Jinja2.

A variant is a TOML file (``rules/variants/<name>.toml``) listing rule files relative to
``rules/`` and preprocessor flags. ``assemble`` renders ``templates/program.dl.j2`` into one
program that ``#include``s the schema and the variant's files. A user rule directory
(``--rules DIR``) extends or overrides the package's rules without touching them: a user
file with the same relative path as a variant file (``DIR/ops/elementwise.dl``) replaces it,
every other ``*.dl`` under ``DIR`` is included after the variant's files, in sorted order.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import jinja2

from toast.errors import RuleError, ToastError

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "rules"
TEMPLATES_DIR = ROOT / "templates"
SCHEMA_FILE = RULES_DIR / "schema.dl"
PROGRAM_NAME = "program.dl"


@dataclass(frozen=True, slots=True)
class Variant:
    """A named choice of rule files and preprocessor flags."""

    name: str
    description: str
    rules: tuple[str, ...]
    defines: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AssembledProgram:
    """The rendered program text and the absolute paths of the rule files it includes."""

    variant: Variant
    text: str
    rule_files: tuple[Path, ...]


def load_variant(name_or_path: str = "default") -> Variant:
    """Read ``rules/variants/<name>.toml`` or a TOML file given by path."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = RULES_DIR / "variants" / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in (RULES_DIR / "variants").glob("*.toml"))
        raise ToastError(f"unknown analysis variant '{name_or_path}' (known: {', '.join(known)})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise RuleError(str(path), getattr(err, "lineno", None), f"malformed variant: {err}") from None
    rules = data.get("rules")
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise RuleError(str(path), None, "variant needs 'rules', a list of rule file paths")
    return Variant(
        name=str(data.get("name", path.stem)),
        description=str(data.get("description", "")),
        rules=tuple(rules),
        defines=tuple(str(d) for d in data.get("defines", [])),
    )


def assemble(variant: Variant, *, user_rules: Path | None = None) -> AssembledProgram:
    """Render the program for ``variant``, with ``user_rules`` overriding/extending it."""
    files: list[Path] = []
    overridden: set[str] = set()
    extra: list[Path] = []
    if user_rules is not None:
        if not user_rules.is_dir():
            raise ToastError(f"--rules {user_rules}: not a directory")
        for path in sorted(user_rules.rglob("*.dl")):
            relative = path.relative_to(user_rules).as_posix()
            if relative in variant.rules:
                overridden.add(relative)
            else:
                extra.append(path.resolve())
    for relative in variant.rules:
        source = (user_rules / relative) if relative in overridden else (RULES_DIR / relative)
        if not source.is_file():
            raise RuleError(str(source), None, f"rule file of variant '{variant.name}' is missing")
        files.append(source.resolve())
    files.extend(extra)
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    text = environment.get_template("program.dl.j2").render(
        variant=variant,
        program_name=PROGRAM_NAME,
        defines=variant.defines,
        schema=SCHEMA_FILE.as_posix(),
        rule_files=[f.as_posix() for f in files],
        user_rules=user_rules is not None,
    )
    return AssembledProgram(variant=variant, text=text, rule_files=tuple(files))
