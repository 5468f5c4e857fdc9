"""Writing output files whole or not at all.

A command that writes several files (``toast shard -o s.json --emit s.mlir``) checks every
path before it starts work (``check_output``), then writes them together (``write_outputs``):
each text goes to a temporary file beside its target first, and only when all are written are
they renamed into place; on any failure the temporaries are removed and no target is touched.
Errors name the option the user gave (``-o``, ``--json``, ``--emit``) and the path.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toast.errors import ToastError


@dataclass(frozen=True, slots=True)
class Output:
    """One file a command writes.

    Attributes:
      option: the command-line option that named it (``-o``, ``--json``, ``--emit``), for messages.
      path: where it goes.
      text: its content.
    """

    option: str
    path: Path
    text: str


def check_output(path: str | os.PathLike[str], *, option: str) -> Path:
    """``path`` as a ``Path`` after checking a file can be written there (before any work).

    Raises:
      ToastError: ``<option> <path>: ...``: the path is a directory, its directory does not
        exist, or the directory is not writable.
    """
    path = Path(path)
    directory = path.parent
    try:
        if path.is_dir():
            raise ToastError(f"{option} {path}: is a directory; give a file name")
        if not directory.is_dir():
            raise ToastError(f"{option} {path}: directory {directory} does not exist")
        if path.exists() and not os.access(path, os.W_OK):
            raise ToastError(f"{option} {path}: the file is not writable")
        # A trial of the temporary file write_outputs stages the text in (its name is longer than the
        # target's), removed at once: permission bits alone do not say (root, read-only mounts).
        handle, trial = tempfile.mkstemp(prefix=_staging_prefix(path), dir=directory)
        os.close(handle)
        os.unlink(trial)
    except OSError as err:
        raise ToastError(f"{option} {path}: cannot write in {directory}: {err.strerror}") from None
    return path


def json_text(document: dict[str, Any]) -> str:
    """The JSON text toast writes (indented, one trailing newline)."""
    return json.dumps(document, indent=1) + "\n"


def write_outputs(outputs: Sequence[Output]) -> None:
    """Write every output, or none (see the module docstring).

    Raises:
      ToastError: a file cannot be written; nothing was written then.
    """
    staged: list[tuple[Output, str]] = []
    try:
        for output in outputs:
            check_output(output.path, option=output.option)
            staged.append((output, _stage(output)))
        for output, temporary in staged:
            os.replace(temporary, output.path)
    except OSError as err:
        raise ToastError(f"{output.option} {output.path}: cannot write: {err.strerror}") from None
    finally:
        for _, temporary in staged:
            Path(temporary).unlink(missing_ok=True)


def _stage(output: Output) -> str:
    """A temporary file beside the target holding the text, with the usual file mode."""
    handle, temporary = tempfile.mkstemp(prefix=_staging_prefix(output.path), dir=output.path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(output.text)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes the file private; give it the usual mode
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return temporary


def _staging_prefix(path: Path) -> str:
    return f".{path.name}."


def _umask() -> int:
    """The process's file-creation mask (reading it means setting it, so set it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
