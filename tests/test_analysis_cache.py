"""The analysis cache (``toast.analysis.cache``): a second analysis of the same program under the same rules,
variant, engine and toast is read back; anything else is analyzed afresh; a corrupt entry is ignored and
rewritten; the folder keeps its size bound; ``--no-cache`` touches nothing.

JAX's locations name the Python stack that lowered a program, which is part of its text and so of the key:
each test analyzes from one line, in a loop.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from toast import analyze
from toast.analysis import cache
from toast.cli import main

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
    common = {"text": "module {}", "name": "m", "rule_files": [], "variant": "v"}
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
