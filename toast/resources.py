"""Where the rules, templates and hardware profiles that ship with toast are.

The project keeps them as top-level folders (``rules/``, ``templates/``, ``hardware/``) so that
users read and edit them beside the code. A wheel carries them inside the package, as
``toast/_data/<folder>`` (``pyproject.toml``, ``force-include``); an editable install or a
source checkout imports ``toast`` from the project, where they sit beside the package. Every
stage reads them through ``resource_dir``, so no other module knows where they are.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import jinja2

Folder = Literal["rules", "templates", "hardware"]


@functools.cache
def resource_dir(folder: Folder) -> Path:
    """The directory of a bundled folder: inside the installed package, else beside it."""
    package = Path(str(files("toast")))
    for candidate in (package / "_data" / folder, package.parent / folder):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"toast's {folder}/ folder is missing from {package} (a broken install?)")


def project_root() -> Path:
    """The folder holding ``rules/`` (rule files are shown relative to it)."""
    return resource_dir("rules").parent


def template(name: str, *, trim_blocks: bool = False, lstrip_blocks: bool = False,
             keep_trailing_newline: bool = False, autoescape: bool = False) -> jinja2.Template:
    """A Jinja2 template of ``templates/`` (undefined variables are errors; ``autoescape`` for HTML)."""
    import jinja2  # here: most commands (a cached analysis read back) render no template

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(resource_dir("templates")),
                                     undefined=jinja2.StrictUndefined, trim_blocks=trim_blocks,
                                     lstrip_blocks=lstrip_blocks, keep_trailing_newline=keep_trailing_newline,
                                     autoescape=autoescape)
    return environment.get_template(name)
