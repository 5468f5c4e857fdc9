"""The analysis cache: an ``Analysis`` kept on disk, found again by what made it.

An entry's key is the SHA-256 of everything the analysis depends on: the program's StableHLO text and name,
the text of every rule file of both stages (the package's and a ``--rules`` folder's) and the variant, the
engine, and toast's own code (its version and a digest of the sources of the stages up to the analysis), with
the Python version the entry was pickled by. So an entry made under other rules, another variant, engine or
toast is never found, and editing a rule file or toast's code is a new key. Entries live under the user's cache
directory (``$TOAST_CACHE_DIR``, else ``$XDG_CACHE_HOME/toast/analyses``, else ``~/.cache/toast/analyses``),
one file each, written whole to a temporary file and renamed into place (``os.replace``), so concurrent
processes (a sweep's workers) share them safely: a reader sees an entry whole or not at all. An entry that
does not load (cut short, corrupt, from an incompatible library) is removed and rewritten. The directory is
kept under a size bound (``$TOAST_CACHE_MAX_BYTES``, default 2 GiB): past it the least recently used entries go.
``$TOAST_NO_CACHE`` set (or ``--no-cache``, ``analyze(..., cache=False)``) bypasses it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Bumped when the entry's format changes.
FORMAT = 1
DEFAULT_MAX_BYTES = 2 << 30
# The stages an analysis is made by: a change to their code is a change of the cached result.
_STAGES = ("frontend", "facts", "datalog", "analysis")
# Modules beside the stages that decide what an entry holds or how it unpickles.
_SHARED = ("errors.py", "frozen.py")
_SUFFIX = ".analysis"


def cache_dir() -> Path:
    """Where entries live (see the module docstring)."""
    explicit = os.environ.get("TOAST_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "toast" / "analyses"


def enabled() -> bool:
    """False when ``$TOAST_NO_CACHE`` is set to anything but ``""`` or ``0``."""
    return os.environ.get("TOAST_NO_CACHE", "") in ("", "0")


def max_bytes() -> int:
    """The size bound of the cache directory, in bytes."""
    try:
        return int(os.environ.get("TOAST_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES))
    except ValueError:
        return DEFAULT_MAX_BYTES


def _code_digest() -> str:
    """toast's version and a digest of the sources of the stages that make an analysis."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    try:
        from importlib.metadata import version

        digest.update(version("toast").encode())
    except Exception:  # not installed (a checkout on sys.path): the sources say it all
        digest.update(b"checkout")
    paths = [path for stage in _STAGES for path in sorted((package / stage).rglob("*.py"))]
    for path in paths + [package / name for name in _SHARED]:
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


_CODE_DIGEST: str | None = None


def analysis_key(*, text: str, name: str, rule_files: Iterable[Path], variant: Any, engine: str,
                 extra: Iterable[str] = ()) -> str:
    """The key of an analysis of program ``text`` (read under ``name``) with ``rule_files`` (every ``.dl`` file
    either stage reads and the templates the programs are assembled from, in any order), ``variant`` (its
    ``repr`` counts), and ``engine``; ``extra``: more text that changes the result."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        _CODE_DIGEST = _code_digest()
    digest = hashlib.sha256()
    for part in (f"format {FORMAT}", _CODE_DIGEST, sys.version.split()[0], engine, repr(variant), name, text,
                 *extra):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    for path in sorted(set(rule_files)):
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def load(key: str) -> Any | None:
    """The entry of ``key``, or ``None``: absent, or one that does not load (then removed)."""
    path = cache_dir() / (key + _SUFFIX)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        entry = pickle.loads(data)
        if not (isinstance(entry, tuple) and len(entry) == 3 and entry[0] == FORMAT and entry[1] == key):
            raise ValueError("not an entry of this key")
    except Exception:  # cut short, corrupt or written by an incompatible library: made again
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: the size bound removes the others first
    return entry[2]


def store(key: str, value: Any) -> None:
    """Write the entry of ``key`` whole (a temporary file renamed into place), then keep the size bound. A cache
    that cannot be written (a read-only home) is skipped: the analysis stands without it."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        data = pickle.dumps((FORMAT, key, value), protocol=pickle.HIGHEST_PROTOCOL)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=key[:16], suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, folder / (key + _SUFFIX))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        _keep_bound(folder, max_bytes())
    except OSError:
        return


def _keep_bound(folder: Path, limit: int) -> None:
    """Remove the least recently used entries until the folder holds at most ``limit`` bytes."""
    entries = []
    for path in folder.glob("*" + _SUFFIX):
        with contextlib.suppress(OSError):
            stat = path.stat()
            entries.append((stat.st_mtime, path.name, stat.st_size, path))
    total = sum(size for _, _, size, _ in entries)
    for _, _, size, path in sorted(entries):
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            total -= size
