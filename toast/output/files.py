"""Writing output files whole or not at all: through a temporary file and a rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from toast.errors import ToastError


def write_json_atomic(document: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``document`` as JSON to ``path`` through a temporary file and a rename."""
    write_text_atomic(json.dumps(document, indent=1) + "\n", path, option="--json")


def write_text_atomic(text: str, path: str | os.PathLike[str], *, option: str = "--output") -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (no partial file)."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ToastError(f"{option} {path}: directory {directory} does not exist")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes the file private; give it the usual mode
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's file-creation mask (reading it means setting it, so set it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
