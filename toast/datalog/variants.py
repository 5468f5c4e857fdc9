"""Analysis variants: which rule files make up the Datalog programs, assembled by Jinja2.

A variant is a TOML file (``rules/variants/<name>.toml``) listing rule files relative to
``rules/`` for each stage (``rules`` for the named-dimension analysis, ``conflict_rules`` for
conflicts and boxes), preprocessor flags, and the Python-side heuristics (``layer_heuristic``,
section 3.6). ``extends = "default"`` starts from another variant and replaces only the keys
given. ``assemble`` renders ``templates/program.dl.j2`` into one program per stage that
``#include``s the stage's schema and rule files. A user rule directory (``--rules DIR``)
extends or overrides the package's rules without touching them: a user file with the same
relative path as a variant file (``DIR/ops/elementwise.dl``) replaces it, every other ``*.dl``
under ``DIR`` is included after the variant's files, in sorted order — in the conflicts stage
when it lies under ``DIR/conflicts/``, else in the named-dimension stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toast.datalog.preprocess import preprocess_text
from toast.errors import RuleError, ToastError
from toast.facts.schema import CONFLICTS, NDA, Stage
from toast.resources import resource_dir, template
from toast.toml_files import read_toml

PROGRAM_NAME = "program.dl"


@dataclass(frozen=True, slots=True)
class Variant:
    """A named choice of rule files, preprocessor flags and heuristics.

    Attributes:
      rules: rule files of the named-dimension stage, relative to ``rules/``.
      conflict_rules: rule files of the conflicts stage (``conflicts/boxes.dl`` is the box
        heuristic of section 3.5).
      defines: preprocessor flags set in both stages.
      layer_heuristic: group isomorphic compatibility sets (section 3.6).
    """

    name: str
    description: str
    rules: tuple[str, ...]
    conflict_rules: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    layer_heuristic: bool = True

    def stage_rules(self, stage: Stage) -> tuple[str, ...]:
        return self.rules if stage is NDA else self.conflict_rules


@dataclass(frozen=True, slots=True)
class AssembledProgram:
    """The rendered program text and the absolute paths of the rule files it includes."""

    variant: Variant
    text: str
    rule_files: tuple[Path, ...]

    def sources(self) -> tuple[tuple[str, str], ...]:
        """``(path, text)`` of the program (under ``PROGRAM_NAME``) and of every file it reads, in the order
        read: the rule files and whatever they ``#include``, as the preprocessor finds them. All the program
        depends on (the analysis cache's key); a ``RuleError`` where the preprocessor fails."""
        return ((PROGRAM_NAME, self.text), *preprocess_text(self.text, PROGRAM_NAME).files)


def load_variant(name_or_path: str = "default") -> Variant:
    """Read ``rules/variants/<name>.toml`` or a TOML file given by path."""
    data, path = _variant_data(name_or_path, seen=())
    for key in ("rules", "conflict_rules", "defines"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
            raise RuleError(str(path), None, f"variant needs '{key}', a list of strings")
    if not data.get("rules"):
        raise RuleError(str(path), None, "variant needs 'rules', a list of rule file paths")
    layers = data.get("layer_heuristic", True)
    if not isinstance(layers, bool):
        raise RuleError(str(path), None, "variant's 'layer_heuristic' must be true or false")
    return Variant(
        name=str(data.get("name", path.stem)),
        description=str(data.get("description", "")),
        rules=tuple(data["rules"]),
        conflict_rules=tuple(data.get("conflict_rules", [])),
        defines=tuple(data.get("defines", [])),
        layer_heuristic=layers,
    )


def known_variants() -> list[str]:
    return sorted(p.stem for p in (resource_dir("rules") / "variants").glob("*.toml"))


def _variant_data(name_or_path: str, *, seen: tuple[Path, ...]) -> tuple[dict, Path]:
    """The variant's keys, those of the variant it ``extends`` filled in under them."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = resource_dir("rules") / "variants" / f"{name_or_path}.toml"
    if not path.is_file():
        raise ToastError(f"unknown analysis variant '{name_or_path}' (known: {', '.join(known_variants())})")
    if path.resolve() in seen:
        raise RuleError(str(path), None, "variant extends itself (a cycle of 'extends')")
    data = read_toml(path, what="variant")
    base = data.get("extends")
    if base is None:
        return data, path
    if not isinstance(base, str):
        raise RuleError(str(path), None, "variant's 'extends' must be a variant name")
    base_data, _ = _variant_data(base, seen=(*seen, path.resolve()))
    merged = {k: v for k, v in base_data.items() if k not in ("name", "description")}
    merged.update({k: v for k, v in data.items() if k != "extends"})
    return merged, path


def assemble(variant: Variant, *, user_rules: Path | None = None, stage: Stage = NDA) -> AssembledProgram:
    """Render the ``stage`` program for ``variant``, with ``user_rules`` overriding/extending it."""
    stage_rules = variant.stage_rules(stage)
    files: list[Path] = []
    overridden: set[str] = set()
    extra: list[Path] = []
    if user_rules is not None:
        if not user_rules.is_dir():
            raise ToastError(f"--rules {user_rules}: not a directory")
        for path in sorted(user_rules.rglob("*.dl")):
            if not path.is_file():  # a folder would fail to read and a FIFO block the read forever
                raise RuleError(str(path), None, "not a regular file (a rule file is a regular *.dl file)")
            relative = path.relative_to(user_rules).as_posix()
            if relative in stage_rules:
                overridden.add(relative)
            elif relative not in variant.rules + variant.conflict_rules and _user_stage(relative) is stage:
                extra.append(path.resolve())
    for relative in stage_rules:
        source = resource_dir("rules") / relative
        if user_rules is not None and relative in overridden:
            source = user_rules / relative
        if not source.is_file():
            raise RuleError(str(source), None, f"rule file of variant '{variant.name}' is missing")
        files.append(source.resolve())
    files.extend(extra)
    text = template("program.dl.j2", keep_trailing_newline=True).render(
        variant=variant,
        stage=stage,
        program_name=PROGRAM_NAME,
        defines=variant.defines,
        schema=(resource_dir("rules") / stage.schema_file).as_posix(),
        rule_files=[f.as_posix() for f in files],
        user_rules=user_rules is not None,
    )
    return AssembledProgram(variant=variant, text=text, rule_files=tuple(files))


def _user_stage(relative: str) -> Stage:
    return CONFLICTS if relative.startswith("conflicts/") else NDA
