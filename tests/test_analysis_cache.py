"""The analysis cache (``toast.analysis.cache``): a second analysis of the same program under the same rules,
variant, engine and toast is read back; anything else is analyzed afresh; a corrupt entry is ignored and
rewritten; the folder keeps its size bound; ``--no-cache`` touches nothing. Issue 36: an entry planted by
someone else, signed or not, linked or another user's, and a folder others may write run no code and say why
in one line; the key holds every file the rules read; arguments are checked before the cache is asked; no home
folder, a bad size bound, dead writers' temporary files and odd ``*.dl`` files are handled.

JAX's locations name the Python stack that lowered a program, which is part of its text and so of the key:
each test analyzes from one line, in a loop, or reads MLP lowered once to a file (``MLP_FILE``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import signal
import stat
import subprocess
import sys
import time
import typing
from pathlib import Path

import numpy as np
import pytest

from toast import analyze
from toast.analysis import cache
from toast.analysis.named_dimensions import Analysis
from toast.cli import main
from toast.datalog.variants import load_variant
from toast.errors import ToastError
from toast.frontend.loading import load_program_text

MLP = "toast.examples.mlp:mlp"


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TOAST_CACHE_DIR", str(folder))
    monkeypatch.delenv("TOAST_NO_CACHE", raising=False)
    return folder


def _entries(folder):
    return sorted(folder.glob("*.analysis")) if folder.exists() else []


def test_a_second_analysis_is_read_back_whole(cache_on):
    first, second = [analyze(MLP, engine="embedded") for _ in range(2)]
    assert (first.stats["cache"], second.stats["cache"]) == ("miss", "hit") and len(_entries(cache_on)) == 1
    assert set(second.stats["seconds"]) == {"read"}
    assert second.colors == first.colors and second.identities == first.identities
    assert np.array_equal(second.color_of, first.color_of) and second.conflicts == first.conflicts
    assert second.program.text == first.program.text and second.kernel_semantics == first.kernel_semantics


def test_other_rules_variant_engine_or_toast_are_never_read_back(cache_on, tmp_path, monkeypatch):
    rules = tmp_path / "rules"
    rules.mkdir()

    def edit(text):
        (rules / "mine.dl").write_text(text)
        return {"rules": rules}

    def other_toast():
        monkeypatch.setattr(cache, "_CODE_DIGEST", "another toast")
        return {}

    changes = [lambda: {}, lambda: {"variant": "no_box"}, lambda: edit('ruled_kind("stablehlo.my_op").\n'),
               lambda: edit('ruled_kind("stablehlo.my_other_op").\n'), other_toast]  # the same folder, edited
    statuses = [analyze(MLP, engine="embedded", **change()).stats["cache"] for change in changes]
    assert statuses == ["miss"] * 5 and len(_entries(cache_on)) == 5
    # The engine is part of the key (Soufflé is not on every machine: the key is checked directly).
    common = {"text": "module {}", "name": "m", "sources": [], "variant": "v"}
    assert cache.analysis_key(engine="souffle", **common) != cache.analysis_key(engine="embedded", **common)


def test_a_corrupt_entry_is_ignored_and_rewritten(cache_on):
    def cut_short(entry):
        entry.write_bytes(entry.read_bytes()[:100])  # as a crash mid-write of another tool would leave it

    def garbage(entry):
        entry.write_bytes(b"not a pickle at all")

    statuses = []
    for damage in (None, cut_short, None, garbage):
        if damage is not None:
            damage(_entries(cache_on)[0])
        statuses.append(analyze(MLP, engine="embedded").stats["cache"])
    assert statuses == ["miss", "miss", "hit", "miss"]
    assert len(_entries(cache_on)) == 1 and not list(cache_on.glob("*.tmp"))


def test_the_folder_keeps_its_size_bound(cache_on, monkeypatch):
    sizes = []
    for variant in ("default", "no_box"):
        analyze(MLP, engine="embedded", variant=variant)
        sizes.append([(p.name, p.stat().st_size) for p in _entries(cache_on)])
        # After the first entry: room for it and no more, so the second replaces it.
        monkeypatch.setenv("TOAST_CACHE_MAX_BYTES", str(sizes[0][0][1] + 10))
    ((first, _),), ((kept, _),) = sizes
    assert kept != first


def test_no_cache_reads_and_writes_nothing(cache_on, capsys):
    assert main(["analyze", MLP, "--engine", "embedded", "--no-cache"]) == 0
    assert _entries(cache_on) == []
    assert analyze(MLP, engine="embedded", cache=False).stats["cache"] == "off"
    capsys.readouterr()
    for _ in range(2):
        assert main(["analyze", MLP, "--engine", "embedded"]) == 0
    assert len(_entries(cache_on)) == 1
    assert "read from the cache" in capsys.readouterr().out


def test_processes_analyzing_at_once_share_one_entry(cache_on):
    """Four processes (as a sweep's workers) analyze one program at once: every one succeeds, and they leave
    one whole entry, which a fifth reads back."""
    command = [sys.executable, "-m", "toast", "analyze", MLP, "--engine", "embedded"]
    env = {**os.environ}
    runs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
    assert [run.wait(timeout=120) for run in runs] == [0, 0, 0, 0]
    for run in runs:
        run.stdout.close()
        run.stderr.close()
    assert len(_entries(cache_on)) == 1 and not list(cache_on.glob("*.tmp"))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "read from the cache" in done.stdout


# Issue 36: what another user, a stale file or a bad setting can do to the cache.


class _Runs:
    """Pickles as a call of ``function(*arguments)``: what a planted entry would run when unpickled."""

    def __init__(self, function, *arguments):
        self.call = (function, arguments)

    def __reduce__(self):
        return self.call


def _payloads(marker):
    """Pickles that create ``marker`` when unpickled by ``pickle.loads``, each through another callable."""
    return {"os.system": pickle.dumps(_Runs(os.system, f"touch {marker}")),
            "open": pickle.dumps(_Runs(open, str(marker), "w"))}


def _signed(folder, key, payload):
    """An entry in the format the module docstring gives: MAGIC, HMAC-SHA256 of (MAGIC, key, NUL, payload) under
    the folder's ``hmac.key``, payload."""
    secret = (folder / "hmac.key").read_bytes()
    return cache.MAGIC + hmac.new(secret, cache.MAGIC + key.encode() + b"\0" + payload, hashlib.sha256).digest() + \
        payload


@pytest.fixture(scope="module", autouse=True)
def mlp_file(tmp_path_factory):
    """MLP lowered once to a file, so that every analysis below reads one program text, from whatever line."""
    global MLP_FILE
    path = tmp_path_factory.mktemp("program") / "mlp.mlir"
    path.write_text(load_program_text(MLP)[0])
    MLP_FILE = str(path)
    return path


MLP_FILE = ""


@pytest.fixture
def filled(cache_on, monkeypatch):
    """The cache holding the analysis of MLP; each test's warnings counted afresh (once per process)."""
    monkeypatch.setattr(cache, "_warned", set(), raising=False)
    analyze(MLP_FILE, engine="embedded")
    (entry,) = _entries(cache_on)
    return entry


def _warnings(capsys):
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith("toast: warning: ") for line in lines), lines
    return lines


def test_the_folder_and_its_key_are_private(filled):
    folder = filled.parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    key = folder / "hmac.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32


@pytest.mark.parametrize("name", ["os.system", "open"])
def test_a_planted_entry_runs_no_code(filled, tmp_path, capsys, name):
    """Another user's pickle written over an entry, without the key: its MAC does not check out, so it is never
    decoded; it is removed and the analysis made and stored again."""
    marker = tmp_path / "ran"
    payload = _payloads(marker)[name]
    pickle.loads(payload)  # the payload is live: unpickled as before, it runs
    assert marker.exists()
    marker.unlink()
    filled.write_bytes(payload)
    assert analyze(MLP_FILE, engine="embedded").stats["cache"] == "miss"
    assert not marker.exists() and _warnings(capsys) == []
    assert analyze(MLP_FILE, engine="embedded").stats["cache"] == "hit"  # rewritten whole


@pytest.mark.parametrize("name", ["os.system", "open", "object array"])
def test_an_entry_that_checks_out_still_builds_only_an_analysis(filled, tmp_path, capsys, name):
    """Even under the right key, an entry naming anything but toast's classes, containers and numeric arrays is
    refused before it is called, with one line saying what it named."""
    marker = tmp_path / "ran"
    payloads = {**_payloads(marker), "object array": pickle.dumps(np.array([1, "text"], dtype=object))}
    filled.write_bytes(_signed(filled.parent, filled.stem, payloads[name]))
    assert analyze(MLP_FILE, engine="embedded").stats["cache"] == "miss"
    assert not marker.exists()
    rebuild = np.array([1, "text"], dtype=object).__reduce_ex__(pickle.HIGHEST_PROTOCOL)[0]  # numpy's own name
    named = {"os.system": f"{os.system.__module__}.system", "open": f"{open.__module__}.open",
             "object array": f"{rebuild.__module__}.{rebuild.__name__}"}[name]
    (line,) = _warnings(capsys)
    assert f"entry {filled} not used: it names {named}" in line


def test_a_folder_others_may_write_is_not_used(filled, tmp_path, capsys):
    """A shared folder (mode 1777, as /tmp): toast analyzes without it, says so once per process, exits 0."""
    marker = tmp_path / "ran"
    filled.write_bytes(_signed(filled.parent, filled.stem, _payloads(marker)["os.system"]))
    filled.parent.chmod(0o1777)
    capsys.readouterr()
    assert [main(["analyze", MLP_FILE, "--engine", "embedded"]) for _ in range(2)] == [0, 0]
    assert not marker.exists() and _entries(filled.parent) == [filled]
    assert _warnings(capsys) == [f"toast: warning: analysis cache {filled.parent} not used: it is writable by other "
                                 "users (mode 1777); analyzing without it (set TOAST_CACHE_DIR to a private folder, "
                                 "or TOAST_NO_CACHE=1)"]


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user takes root")
def test_another_users_entry_is_not_read(filled, tmp_path, capsys):
    marker = tmp_path / "ran"
    filled.write_bytes(_signed(filled.parent, filled.stem, _payloads(marker)["os.system"]))
    os.chown(filled, 12345, 12345)
    assert analyze(MLP_FILE, engine="embedded").stats["cache"] == "miss"
    assert not marker.exists()
    assert _warnings(capsys) == [f"toast: warning: analysis cache entry {filled} not used: it belongs to user id "
                                 "12345, not to you (user id 0)"]
    assert filled.stat().st_uid == 0  # replaced by the new entry


def test_a_symbolic_link_entry_is_not_followed(filled, tmp_path, capsys):
    marker = tmp_path / "ran"
    elsewhere = tmp_path / "elsewhere.analysis"
    elsewhere.write_bytes(_signed(filled.parent, filled.stem, _payloads(marker)["os.system"]))
    filled.unlink()
    filled.symlink_to(elsewhere)
    assert analyze(MLP_FILE, engine="embedded").stats["cache"] == "miss"
    assert not marker.exists()
    assert _warnings(capsys) == [f"toast: warning: analysis cache entry {filled} not used: it is a symbolic link"]
    assert not filled.is_symlink() and analyze(MLP_FILE, engine="embedded").stats["cache"] == "hit"


def test_no_home_folder_means_no_cache(monkeypatch, capsys):
    """No $HOME and a user id without a passwd entry: Path.home() cannot answer; toast analyzes without a cache
    and says so once."""
    for name in ("HOME", "XDG_CACHE_HOME", "TOAST_CACHE_DIR", "TOAST_NO_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cache, "_warned", set(), raising=False)

    def no_home(cls=None):
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", classmethod(no_home))
    capsys.readouterr()
    assert [main(["analyze", MLP_FILE, "--engine", "embedded"]) for _ in range(2)] == [0, 0]
    (line,) = _warnings(capsys)
    assert line.startswith("toast: warning: analysis cache not used: there is no home folder to keep it in")


@pytest.mark.parametrize("value", ["-1", "abc", "2GiB"])
def test_a_bad_size_bound_turns_the_cache_off(cache_on, monkeypatch, capsys, value):
    monkeypatch.setattr(cache, "_warned", set(), raising=False)
    cache_on.mkdir(mode=0o700)
    mine = [cache_on / "notes.analysis", cache_on / ("0" * 64 + ".analysis")]
    for path in mine:
        path.write_text("a user's own file")
    monkeypatch.setenv("TOAST_CACHE_MAX_BYTES", value)
    assert [analyze(MLP_FILE, engine="embedded").stats["cache"] for _ in range(2)] == ["miss", "miss"]
    assert _entries(cache_on) == sorted(mine)
    assert _warnings(capsys) == [f"toast: warning: analysis cache not used: TOAST_CACHE_MAX_BYTES='{value}' is not a "
                                 "whole number of bytes (0 or more)"]


def test_the_size_bound_removes_only_toasts_own_entries(cache_on, monkeypatch):
    """At a bound of 0 bytes the new entry itself goes, and nothing else: not a user's ``*.analysis`` file, nor
    one named like an entry but not in toast's format."""
    cache_on.mkdir(mode=0o700)
    mine = [cache_on / "notes.analysis", cache_on / ("0" * 64 + ".analysis")]
    for path in mine:
        path.write_text("a user's own file")
    monkeypatch.setenv("TOAST_CACHE_MAX_BYTES", "0")
    assert analyze(MLP_FILE, engine="embedded").stats["cache"] == "miss"
    assert _entries(cache_on) == sorted(mine)


def test_temporary_files_of_dead_writers_are_removed(cache_on):
    """A writer killed mid-write leaves its temporary file: a later store removes it once it is 10 minutes old;
    a younger one (a writer at work) and a user's ``.tmp`` file stay."""
    cache_on.mkdir(mode=0o700)
    old, young, users = (cache_on / "0123456789abcdefk3j_x9a1.tmp", cache_on / "0123456789abcdef.00aa11bb22cc33dd.tmp",
                         cache_on / "notes.tmp")
    for path in (old, young, users):
        path.write_bytes(b"\x80\x05 cut short")
    an_hour_ago = time.time() - 3600
    for path in (old, users):
        os.utime(path, (an_hour_ago, an_hour_ago))
    analyze(MLP_FILE, engine="embedded")
    assert sorted(cache_on.glob("*.tmp")) == sorted([young, users])


def test_an_included_file_is_part_of_the_key(cache_on, tmp_path):
    """A rule file's ``#include`` (not a ``*.dl`` file of the folder): edited, the analysis is made afresh;
    broken, the error is reported, not the cached analysis."""
    rules = tmp_path / "rules"
    (rules / "parts").mkdir(parents=True)
    (rules / "mine.dl").write_text('#include "parts/kinds.inc"\n')
    included = rules / "parts" / "kinds.inc"
    statuses = []
    for text in ('ruled_kind("stablehlo.my_op").\n', 'ruled_kind("stablehlo.my_op").\n',
                 'ruled_kind("stablehlo.my_other_op").\n'):
        included.write_text(text)
        statuses.append(analyze(MLP_FILE, engine="embedded", rules=rules).stats["cache"])
    assert statuses == ["miss", "hit", "miss"]
    included.write_text('ruled_kind("stablehlo.my_op")\n')  # no final '.'
    with pytest.raises(ToastError, match="kinds.inc"):
        analyze(MLP_FILE, engine="embedded", rules=rules)


def test_a_rule_file_a_variant_names_by_path_is_part_of_the_key(cache_on, tmp_path):
    mine = tmp_path / "mine.dl"
    variant = tmp_path / "mine.toml"
    rules = [*load_variant("default").rules, str(mine)]
    variant.write_text('extends = "default"\nrules = [' + ", ".join(f'"{rule}"' for rule in rules) + "]\n")
    statuses = []
    for text in ('ruled_kind("stablehlo.my_op").\n', 'ruled_kind("stablehlo.my_op").\n',
                 'ruled_kind("stablehlo.my_other_op").\n'):
        mine.write_text(text)
        statuses.append(analyze(MLP_FILE, engine="embedded", variant=str(variant)).stats["cache"])
    assert statuses == ["miss", "hit", "miss"]


def test_arguments_are_checked_before_the_cache_is_asked(filled, tmp_path, capsys):
    """A mistyped ``--rules`` folder, variant or engine is an error on a cached program too."""
    capsys.readouterr()
    assert main(["analyze", MLP_FILE, "--engine", "embedded", "--rules", str(tmp_path / "rulez")]) == 2
    assert capsys.readouterr().err == f"toast: error: --rules {tmp_path / 'rulez'}: not a directory\n"
    assert main(["analyze", MLP_FILE, "--engine", "embedded", "--variant", "defualt"]) == 2
    assert capsys.readouterr().err.startswith("toast: error: unknown analysis variant 'defualt' (known: default,")
    with pytest.raises(ToastError, match="unknown engine 'embeded'"):
        analyze(MLP_FILE, engine="embeded")
    assert analyze(MLP_FILE, engine="embedded").stats["cache"] == "hit"  # the cached analysis was there


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_only_regular_files_are_rule_files(cache_on, tmp_path, capsys, kind):
    """A folder or a FIFO named ``*.dl`` in a ``--rules`` folder: one line naming it (a FIFO's read would
    block forever: the alarm ends the test instead)."""
    rules = tmp_path / "rules"
    rules.mkdir()
    odd = rules / "odd.dl"
    odd.mkdir() if kind == "folder" else os.mkfifo(odd)

    def blocked(signum, frame):
        raise TimeoutError("blocked reading a FIFO")

    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(30)
    try:
        status = main(["analyze", MLP_FILE, "--engine", "embedded", "--rules", str(rules)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert status == 2
    assert capsys.readouterr().err == (f"toast: error: {odd}: not a regular file (a rule file is a regular *.dl "
                                       "file)\n")


def test_every_class_an_analysis_holds_may_be_read_back():
    """The unpickler's allowlist names every toast class reachable from ``Analysis``'s fields (a class added
    there and not to ``cache._TOAST_CLASSES`` would make every entry a miss)."""
    found = set()

    def visit(hint):
        for argument in typing.get_args(hint):
            visit(argument)
        if isinstance(hint, type) and hint.__module__.startswith("toast.") and hint not in found:
            found.add(hint)
            for field_hint in typing.get_type_hints(hint).values():
                visit(field_hint)

    visit(Analysis)
    assert {f"{cls.__module__}:{cls.__name__}" for cls in found} <= set(cache._TOAST_CLASSES)
    assert len(found) >= 15  # the walk reached the classes inside (colors, conflicts, the program's ops...)
