"""The package layout shows the data path: no stage imports a later one, and no module cycles.

Stages in data-path order (ARCHITECTURE.md). ``toast.errors``, ``toast.processes``, ``toast.resources`` and
``toast.toml_files`` are shared by every stage and import no stage; ``toast.examples`` are inputs and import no
stage but the frontend's factory resolver; ``toast/__init__.py`` re-exports every stage's public API, and
``toast.torch`` the PyTorch path's (it composes the frontend's tracing with the output stage's ``autoshard``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import toast

STAGES = ("frontend", "facts", "datalog", "analysis", "sharding", "cost", "search", "output", "xla", "evaluation",
          "cli")
SHARED = ("errors", "frozen", "lazy", "processes", "resources", "toml_files")
PUBLIC_APIS = ("toast", "toast.torch")  # facades over every stage
PACKAGE = Path(toast.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every ``toast...`` module ``path`` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(n for n in names if n.split(".")[0] == "toast")
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "toast")
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "_data" not in p.parts}
    graph = {}
    for name, path in modules.items():
        # ``from toast.x import y`` names module toast.x.y when it exists, else toast.x.
        graph[name] = {target for target in _imports(path) if target in modules}
    return graph


def _stage(module: str) -> str:
    parts = module.split(".")
    if parts[1:] == ["__main__"]:
        return "cli"  # ``python -m toast``: the command line's entry point
    if module in PUBLIC_APIS:
        return ""
    return parts[1] if len(parts) > 1 else ""


def test_every_module_belongs_to_a_stage():
    for module in _graph():
        assert _stage(module) in (*STAGES, *SHARED, "examples", ""), f"{module} is in no stage of the data path"


def test_no_stage_imports_a_later_stage():
    order = {stage: k for k, stage in enumerate(STAGES)}
    problems = []
    for module, targets in sorted(_graph().items()):
        stage = _stage(module)
        if module in PUBLIC_APIS:
            continue  # a public API re-exports every stage
        for target in sorted(targets):
            target_stage = _stage(target)
            if target == "toast":
                problems.append(f"{module} imports the top-level toast package (import a stage's module)")
            elif stage in SHARED and target_stage not in SHARED:
                problems.append(f"{module} (shared) imports {target}, a stage")
            elif stage == "examples":
                if target_stage in STAGES and target != "toast.frontend.loading" and target_stage != "examples":
                    problems.append(f"{module} (an example) imports {target}")
            elif target_stage in order and order[target_stage] > order[stage]:
                problems.append(f"{module} ({stage}) imports {target} ({target_stage}), a later stage")
    assert not problems, "\n".join(problems)


def test_no_import_cycle():
    graph = _graph()
    # A package's __init__ re-exports its modules; edges from a module up to its own package
    # would make every re-export a cycle, so they are followed into the package's modules only.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if module.startswith(target + "."):
                continue  # a module importing its own package's __init__ (only for re-exports)
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_layering_check_sees_a_violation(tmp_path):
    """The import walker finds imports inside functions too (a later-stage import there is the
    common slip)."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from toast.cost.model import CostModel\n    return CostModel\n")
    assert _imports(sample) == {"toast.cost.model", "toast.cost.model.CostModel"}


def test_only_public_jax_apis():
    """jax's private modules (``jax._src``) change without notice; toast uses the public ones."""
    private = [f"{path.relative_to(PACKAGE.parent)}: {target}" for path in sorted(PACKAGE.rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               for target in ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                              else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
               if target.startswith("jax._src")]
    assert not private
