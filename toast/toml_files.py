"""Reading the TOML files users write (hardware profiles, roles, analysis variants) with one-line
errors that point at the file, line and column."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from toast.errors import ToastError

_POSITION = re.compile(r" \(at line (\d+), column (\d+)\)")


def read_toml(path: Path, *, what: str) -> dict[str, Any]:
    """The document of the TOML file ``path``.

    Args:
      path: the file.
      what: what the file is, for messages (``"hardware profile"``).

    Raises:
      ToastError: ``path: cannot read ...`` or ``path:line:column: malformed <what>: ...``.
    """
    return parse_toml(read_text(path, what=what), path, what=what)


def read_text(path: Path, *, what: str) -> str:
    """The text of the file ``path`` (``what`` it is, for messages).

    Raises:
      ToastError: ``path: cannot read <what>: ...``.
    """
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise ToastError(f"{path}: cannot read {what}: {reason}") from None


def parse_toml(text: str, path: Path | str, *, what: str) -> dict[str, Any]:
    """The document of TOML ``text`` read from ``path`` (for messages), with ``read_toml``'s errors."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        # Python 3.11's error gives its position only inside the message.
        found = _POSITION.search(str(err))
        where = f"{path}:{found.group(1)}:{found.group(2)}" if found else str(path)
        raise ToastError(f"{where}: malformed {what}: {_POSITION.sub('', str(err))}") from None
