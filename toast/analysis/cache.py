"""The analysis cache: an ``Analysis`` kept on disk, found again by what made it.

**Key.** An entry's key is the SHA-256 of everything the analysis depends on: the program's StableHLO text
and name, every file the two assembled Datalog programs read (each rendered program and every file the
preprocessor opened for it, ``#include``s and rule files a variant names by path among them: path and text;
``toast.datalog.variants.AssembledProgram.sources``), the variant, the engine, and toast's own code (its
version and a digest of the sources of the stages up to the analysis), with the Python version. So an entry
made under other rules, another variant, engine or toast is never found, and editing any file the rules read
or toast's code is a new key.

**Folder.** ``$TOAST_CACHE_DIR``, else ``$XDG_CACHE_HOME/toast/analyses``, else ``~/.cache/toast/analyses``:
a private folder, created with mode 0700. A folder that is not the user's own or that others may write
(group or world writable: a shared ``/tmp`` folder), a folder that cannot be named (no ``$HOME`` and no passwd
entry) and a bad ``$TOAST_CACHE_MAX_BYTES`` make the cache unusable: toast analyzes without it and says why in
one ``toast: warning:`` line on stderr, once per process; the exit status is unchanged. A folder that cannot be
created or written (a read-only home) is skipped without a word.

**Entries.** One file per key, ``<key>.analysis``: ``MAGIC``, the HMAC-SHA256 of the key and the payload under
the user's secret key (32 random bytes in the folder's ``hmac.key``, mode 0600, made once), then the payload:
the analysis pickled. A read opens the entry without following a symbolic link and refuses one that is not a
regular file of the user's that only they may write (one warning line); checks the MAC before anything is
decoded (a bad one: a stale or foreign entry, removed and made again); and decodes with an unpickler that
builds only toast's analysis classes (``_TOAST_CLASSES``), plain containers and numeric numpy arrays: any other
global (``os.system``, say) is refused, never called. So an entry someone else planted never runs code, and
one tampered with is not believed. An entry is written whole to a temporary file renamed into place
(``os.replace``), so concurrent processes (a sweep's workers) share them safely: a reader sees an entry whole or
not at all; temporary files a killed writer left behind are removed after ``_STALE_TEMPORARY_S``. The folder
is kept under a size bound (``$TOAST_CACHE_MAX_BYTES``, a whole number of bytes, default 2 GiB): past it the
least recently used entries go, and only toast's own entries (named by a key, in toast's format) are ever
removed. ``$TOAST_NO_CACHE`` set (or ``--no-cache``, ``analyze(..., cache=False)``) bypasses it.
"""

from __future__ import annotations

import builtins
import contextlib
import copyreg
import errno
import hashlib
import hmac
import importlib
import io
import os
import pickle
import re
import secrets
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toast.errors import ToastError

# Bumped when the entry's format changes.
FORMAT = 2
MAGIC = b"toast-analysis\x00\x02"
DEFAULT_MAX_BYTES = 2 << 30
# The stages an analysis is made by: a change to their code is a change of the cached result.
_STAGES = ("frontend", "facts", "datalog", "analysis")
# Modules beside the stages that decide what an entry holds or how it unpickles.
_SHARED = ("errors.py", "frozen.py")
_SUFFIX = ".analysis"
_KEY_FILE = "hmac.key"
_SECRET_BYTES = 32
_MAC_BYTES = hashlib.sha256().digest_size
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}" + re.escape(_SUFFIX))
# Temporary files of an entry (``<key prefix>.<random>.tmp``; format 1: ``mkstemp``'s ``<key prefix><random>.tmp``)
# and of the secret key.
_TEMPORARY_NAME = re.compile(r"(?:[0-9a-f]{16}|" + re.escape(_KEY_FILE) + r")\.?[0-9a-z_]{8,16}\.tmp")
# A temporary file this old, in seconds, was left by a writer that died (a write takes well under a minute).
_STALE_TEMPORARY_S = 600.0
# The classes an entry may build: every toast class an ``Analysis`` holds (``tests/test_analysis_cache.py``
# checks this against the dataclasses' fields).
_TOAST_CLASSES = (
    "toast.analysis.conflict_types:Box",
    "toast.analysis.conflict_types:ColorConflict",
    "toast.analysis.conflict_types:CompatibilitySet",
    "toast.analysis.conflict_types:Conflict",
    "toast.analysis.conflict_types:ConflictSite",
    "toast.analysis.conflict_types:Conflicts",
    "toast.analysis.conflict_types:ResolutionGroup",
    "toast.analysis.kernel_semantics:KernelClass",
    "toast.analysis.kernel_semantics:KernelSemantics",
    "toast.analysis.named_dimensions:Analysis",
    "toast.analysis.named_dimensions:Color",
    "toast.analysis.named_dimensions:DimRef",
    "toast.analysis.named_dimensions:Identity",
    "toast.analysis.named_dimensions:Invalid",
    "toast.analysis.named_dimensions:Pin",
    "toast.analysis.named_dimensions:UnruledOp",
    "toast.facts.numbering:DimensionNames",
    "toast.facts.numbering:UseSite",
    "toast.frontend.ir:Op",
    "toast.frontend.ir:Program",
    "toast.frontend.ir:Value",
)
# Builtins an entry may name: containers and numbers, built from data only.
_BUILTINS = ("bytearray", "complex", "dict", "frozenset", "list", "set", "tuple")


class UnusableCache(ToastError):
    """The cache cannot be used (a shared folder, no folder, a bad setting): ``str()`` says why."""


class _Refused(pickle.UnpicklingError):
    """An entry names something an analysis never holds: ``str()`` says what."""


@dataclass(frozen=True, slots=True)
class _Folder:
    """The open cache folder: its path (for messages) and a descriptor every file is reached through."""

    path: Path
    fd: int


_warned: set[str] = set()


def _warn(message: str) -> None:
    """Say ``message`` on stderr as one ``toast: warning:`` line, the first time only in this process."""
    if message not in _warned:
        _warned.add(message)
        print(f"toast: warning: {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where entries live (see the module docstring); ``UnusableCache`` when no folder can be named."""
    explicit = os.environ.get("TOAST_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME")
    if base:
        return Path(base) / "toast" / "analyses"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no $HOME and no passwd entry for this user id
        raise UnusableCache(f"analysis cache not used: there is no home folder to keep it in ($HOME is unset and "
                            f"user id {os.getuid()} has no passwd entry); set TOAST_CACHE_DIR to a private "
                            "folder, or TOAST_NO_CACHE=1") from None
    return home / ".cache" / "toast" / "analyses"


def enabled() -> bool:
    """False when ``$TOAST_NO_CACHE`` is set to anything but ``""`` or ``0``."""
    return os.environ.get("TOAST_NO_CACHE", "") in ("", "0")


def max_bytes() -> int:
    """The size bound of the cache folder, in bytes; ``UnusableCache`` for a value that is not a whole number."""
    value = os.environ.get("TOAST_CACHE_MAX_BYTES", "")
    if not value.strip():
        return DEFAULT_MAX_BYTES
    if not re.fullmatch(r"[0-9]+", value.strip()):
        raise UnusableCache(f"analysis cache not used: TOAST_CACHE_MAX_BYTES={value!r} is not a whole number of "
                            "bytes (0 or more)")
    return int(value)


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


def analysis_key(*, text: str, name: str, sources: Iterable[tuple[str, str]], variant: Any, engine: str,
                 extra: Iterable[str] = ()) -> str:
    """The key of an analysis of program ``text`` (read under ``name``) whose Datalog programs read ``sources``
    (``(path, text)`` of every file they read, in the order read: ``AssembledProgram.sources``), ``variant``
    (its ``repr`` counts), and ``engine``; ``extra``: more text that changes the result."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        _CODE_DIGEST = _code_digest()
    digest = hashlib.sha256()
    for part in (f"format {FORMAT}", _CODE_DIGEST, sys.version.split()[0], engine, repr(variant), name, text,
                 *extra):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    for path, source in sources:
        digest.update(f"{path}\0{source}\0".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def load(key: str) -> Any | None:
    """The entry of ``key``, or ``None``: absent, refused (a warning says why), or one that does not check
    out or decode (then removed, to be made again)."""
    try:
        max_bytes()  # a bad setting turns the cache off, reads included
        with _open_folder(create=False) as folder:
            if folder is None:
                return None
            secret = _secret(folder, create=False)
            return None if secret is None else _read_entry(folder, key, secret)
    except UnusableCache as err:
        _warn(str(err))
    except OSError:  # an unreadable folder: analyzed afresh
        pass
    return None


def store(key: str, value: Any) -> None:
    """Write the entry of ``key`` whole (a temporary file renamed into place), then keep the size bound. A cache
    that cannot be written (a read-only home) is skipped: the analysis stands without it."""
    try:
        limit = max_bytes()
        with _open_folder(create=True) as folder:
            assert folder is not None
            secret = _secret(folder, create=True)
            assert secret is not None
            payload = _dumps(value)
            temporary = f"{key[:16]}.{secrets.token_hex(8)}.tmp"
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=folder.fd)
            try:
                with open(handle, "wb") as out:
                    out.write(MAGIC)
                    out.write(_mac(secret, key, payload))
                    out.write(payload)
                os.replace(temporary, key + _SUFFIX, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=folder.fd)
                raise
            _tidy(folder, limit)
    except UnusableCache as err:
        _warn(str(err))
    except OSError:
        return


@contextlib.contextmanager
def _open_folder(*, create: bool) -> Iterator[_Folder | None]:
    """The cache folder, opened and checked to be the user's own and private (``UnusableCache`` if not);
    ``None`` when it does not exist and ``create`` is false. Created with mode 0700."""
    path = cache_dir()
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        yield None
        return
    except NotADirectoryError:
        raise UnusableCache(f"analysis cache {path} not used: it is not a folder") from None
    try:
        problem = _problem(os.fstat(fd), kind="folder")
        if problem:
            raise UnusableCache(f"analysis cache {path} not used: {problem}; analyzing without it (set "
                                "TOAST_CACHE_DIR to a private folder, or TOAST_NO_CACHE=1)")
        yield _Folder(path, fd)
    finally:
        os.close(fd)


def _problem(info: os.stat_result, *, kind: str, private: bool = False) -> str | None:
    """Why a file (``kind`` ``"file"``) or folder with status ``info`` is not to be trusted, or ``None``:
    not of that kind, not the user's, writable by others (``private``: readable by others)."""
    is_kind = stat.S_ISDIR if kind == "folder" else stat.S_ISREG
    mode = stat.S_IMODE(info.st_mode)
    if not is_kind(info.st_mode):
        return "it is not a folder" if kind == "folder" else "it is not a regular file"
    if info.st_uid != os.getuid():
        return f"it belongs to user id {info.st_uid}, not to you (user id {os.getuid()})"
    if mode & 0o022:
        return f"it is writable by other users (mode {mode:o})"
    if private and mode & 0o077:
        return f"other users may read it (mode {mode:o})"
    return None


def _open_file(folder: _Folder, name: str) -> int:
    """A descriptor of ``name`` in ``folder`` for reading, never through a symbolic link (``ELOOP``) and never
    blocking (a FIFO)."""
    return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder.fd)


def _secret(folder: _Folder, *, create: bool) -> bytes | None:
    """The user's secret key of ``folder`` (``None`` when there is none yet and ``create`` is false); made
    once: written to a private temporary file, then linked into place (a link never replaces a file, so
    processes racing to make it agree on the first)."""
    where = folder.path / _KEY_FILE
    try:
        handle = _open_file(folder, _KEY_FILE)
    except FileNotFoundError:
        if not create:
            return None
        return _make_secret(folder)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnusableCache(f"analysis cache {folder.path} not used: its key file {where} is a symbolic "
                                "link") from None
        raise
    with open(handle, "rb") as source:
        problem = _problem(os.fstat(handle), kind="file", private=True)
        secret = b"" if problem else source.read(_SECRET_BYTES + 1)
    if problem or len(secret) != _SECRET_BYTES:
        reason = problem or f"it is not {_SECRET_BYTES} bytes long"
        raise UnusableCache(f"analysis cache {folder.path} not used: its key file {where} is not to be trusted: "
                            f"{reason}; remove it to start the cache afresh")
    return secret


def _make_secret(folder: _Folder) -> bytes:
    """A new secret key for ``folder`` (see ``_secret``), or the one a racing process linked first."""
    temporary = f"{_KEY_FILE}.{secrets.token_hex(8)}.tmp"
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=folder.fd)
    try:
        secret = secrets.token_bytes(_SECRET_BYTES)
        with open(handle, "wb") as out:
            out.write(secret)
        try:
            os.link(temporary, _KEY_FILE, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
        except FileExistsError:  # another process made it first: that one is the key
            found = _secret(folder, create=False)
            assert found is not None
            return found
        return secret
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=folder.fd)


def _mac(secret: bytes, key: str, payload: bytes | memoryview) -> bytes:
    """The HMAC-SHA256 of an entry: its key (an entry moved to another name does not check out) and payload."""
    code = hmac.new(secret, MAGIC + key.encode("ascii") + b"\0", hashlib.sha256)
    code.update(payload)
    return code.digest()


def _read_entry(folder: _Folder, key: str, secret: bytes) -> Any | None:
    """The checked and decoded entry of ``key`` (see ``load``)."""
    name = key + _SUFFIX
    try:
        handle = _open_file(folder, name)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            _warn(f"analysis cache entry {folder.path / name} not used: it is a symbolic link")
        return None
    with open(handle, "rb") as source:
        problem = _problem(os.fstat(handle), kind="file")
        if problem:
            _warn(f"analysis cache entry {folder.path / name} not used: {problem}")
            return None
        data = source.read()
        header = len(MAGIC) + _MAC_BYTES
        body = memoryview(data)[header:]
        if (len(data) < header or data[:len(MAGIC)] != MAGIC
                or not hmac.compare_digest(data[len(MAGIC):header], _mac(secret, key, body))):
            _remove(folder, name)  # cut short, stale or not made with this key: made again
            return None
        try:
            value = _Unpickler(io.BytesIO(body)).load()
        except _Refused as err:
            _warn(f"analysis cache entry {folder.path / name} not used: {err}")
            _remove(folder, name)
            return None
        except Exception:  # written by an incompatible library: made again
            _remove(folder, name)
            return None
        with contextlib.suppress(OSError):
            os.utime(handle)  # recently used: the size bound removes the others first
    return value


def _remove(folder: _Folder, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=folder.fd)


def _contiguous_array(array: np.ndarray) -> Any:
    """Pickle ``array`` as numpy does a contiguous one (``_frombuffer`` of its bytes), the one way ``load``
    rebuilds arrays."""
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        array = array.copy(order="C")
    return array.__reduce_ex__(pickle.HIGHEST_PROTOCOL)


def _dumps(value: Any) -> bytes:
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table, np.ndarray: _contiguous_array}  # type: ignore[dict-item]
    pickler.dump(value)
    return out.getvalue()


def _numeric_only(build: Callable[..., Any], what: str) -> Callable[..., Any]:
    """``build`` (numpy's rebuilder of ``what``) refusing any dtype that holds Python objects."""

    def checked(*args: Any) -> Any:
        dtypes = [arg for arg in args if isinstance(arg, np.dtype)]
        if len(dtypes) != 1 or dtypes[0].hasobject:
            raise _Refused(f"it holds a {what} that is not plain numbers")
        return build(*args)

    return checked


def _global_name(obj: Any) -> tuple[str, str]:
    return obj.__module__, obj.__name__


_ALLOWED: dict[tuple[str, str], Any] | None = None


def _allowed() -> dict[tuple[str, str], Any]:
    """``(module, name) -> object`` of every global an entry may name."""
    global _ALLOWED
    if _ALLOWED is None:
        allowed: dict[tuple[str, str], Any] = {("builtins", name): getattr(builtins, name) for name in _BUILTINS}
        for spec in _TOAST_CLASSES:
            module, name = spec.split(":")
            allowed[(module, name)] = getattr(importlib.import_module(module), name)
        # numpy's rebuilders, as this numpy names them (numpy 1 and 2 differ).
        frombuffer: Any = np.zeros(1).__reduce_ex__(pickle.HIGHEST_PROTOCOL)[0]
        scalar: Any = np.float64(0).__reduce_ex__(pickle.HIGHEST_PROTOCOL)[0]
        allowed[_global_name(frombuffer)] = _numeric_only(frombuffer, "array")
        allowed[_global_name(scalar)] = _numeric_only(scalar, "scalar")
        allowed[("numpy", "dtype")] = np.dtype
        _ALLOWED = allowed
    return _ALLOWED


class _Unpickler(pickle.Unpickler):
    """Builds only what ``_allowed`` names: toast's analysis classes, containers and numeric numpy arrays."""

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed().get((module, name))
        if found is None:
            raise _Refused(f"it names {module}.{name}, which no analysis holds (refused, never called)")
        return found


def _tidy(folder: _Folder, limit: int) -> None:
    """Remove the temporary files dead writers left, then the least recently used entries until the folder's
    entries take at most ``limit`` bytes. Only toast's own files go: entries by name and format, temporary
    files by name; never a symbolic link or another user's file."""
    now = time.time()
    entries = []
    with os.scandir(folder.fd) as listing:
        for item in listing:
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                continue
            if _TEMPORARY_NAME.fullmatch(item.name):
                if now - info.st_mtime > _STALE_TEMPORARY_S:
                    _remove(folder, item.name)
            elif _ENTRY_NAME.fullmatch(item.name):
                entries.append((info.st_mtime, item.name, info.st_size))
    total = sum(size for _, _, size in entries)
    for _, name, size in sorted(entries):
        if total <= limit:
            break
        if _is_entry(folder, name):
            _remove(folder, name)
            total -= size


def _is_entry(folder: _Folder, name: str) -> bool:
    """Whether ``name`` holds an entry of toast's: this format's ``MAGIC``, or format 1's pickle of
    ``(1, key, analysis)`` (its key in its first bytes)."""
    try:
        handle = _open_file(folder, name)
    except OSError:
        return False
    with open(handle, "rb") as source:
        head = source.read(128)
    return head.startswith(MAGIC) or (head.startswith(b"\x80") and name[:64].encode() in head)
