"""Failed invariants stop the analysis (issue 36): rows of the rules' ``invalid`` output are an error, on the command
line (``toast: error: FILE:LINE: CHECK: DETAIL``, exit 2, before any search, pricing or output) and in the Python API
(``InvalidRules``, whose ``rows`` hold them all), cached analysis or not.

Two rule files of a user's ``--rules`` folder break them: one identifies every name with every other
(``ident_size``: the rule's own file and line are at fault), one gives dot_general a second, unknown kernel class
(``kernel_class_twice`` and ``kernel_class_unknown``: the checks of ``rules/nda.dl``). The program is ``tanh`` of an
``f32[2, 3]``: names 0 .. 7 are x's dims (0, 1), the result's (2, 3), tanh's use of x (4, 5) and the return's use of
the result (6, 7); the even ones have 2 elements, the odd ones 3. So the first rule makes 2 x 4 x 4 = 32 identities
of names of different sizes, the first in order ``names 0 (2 elements) and 1 (3 elements)``.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import engines

from toast import analyze, autoshard
from toast.cli import main
from toast.errors import InvalidRules, ToastError

IDENTIFY_ALL = 'ident(A, B, 0, "c.dl", 1) :- name_size(A, _), name_size(B, _).\n'
BOGUS_CLASS = 'kernel_class("stablehlo.dot_general", "bogus").\n'

FIRST_IDENTITY = "c.dl:1: ident_size: op 0: names 0 (2 elements) and 1 (3 elements)"
# The other 31 identities; with all names in one node, the conflicts stage finds both dims of x and of the result
# (its check on definitions) and of tanh's and the return's uses (its check on uses) in one node.
IDENTIFY_ALL_LINE = (re.escape(FIRST_IDENTITY) + r" \.\.\. and 35 more: 31 ident_size at c\.dl:1, "
                     r"2 self_conflict at rules/conflicts/conflicts\.dl:\d+, "
                     r"2 self_conflict at rules/conflicts/conflicts\.dl:\d+")
# kernel_class_twice both ways (bogus and matmul, matmul and bogus), kernel_class_unknown once; in order of
# check, then detail. Their rules' lines in rules/nda.dl are not the point here.
KERNEL_CLASS_LINE = (r"rules/nda\.dl:\d+: kernel_class_twice: stablehlo\.dot_general: bogus and matmul "
                     r"\.\.\. and 2 more: 1 kernel_class_twice at rules/nda\.dl:\d+, "
                     r"1 kernel_class_unknown at rules/nda\.dl:\d+")

X = jax.ShapeDtypeStruct((2, 3), jnp.float32)

TINY_MODULE = '''
import jax
import jax.numpy as jnp


def tiny():
    return jnp.tanh, [jax.ShapeDtypeStruct((2, 3), jnp.float32)]
'''


def _rules(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "mine.dl").write_text(text)
    return folder


def _check_identify_all(err: InvalidRules) -> None:
    assert re.fullmatch(IDENTIFY_ALL_LINE, str(err)), str(err)
    identities = [row for row in err.rows if row.check == "ident_size"]
    assert len(identities) == 32 and all((row.file, row.line) == ("c.dl", 1) for row in identities)
    assert str(err.rows[0]) == FIRST_IDENTITY


@pytest.mark.parametrize("engine", engines())
def test_toast_analyze_raises_on_an_identity_of_names_of_different_sizes(engine, tmp_path):
    with pytest.raises(InvalidRules) as raised:
        analyze("tiny", fn=jnp.tanh, args=[X], engine=engine, rules=_rules(tmp_path, IDENTIFY_ALL))
    _check_identify_all(raised.value)
    assert isinstance(raised.value, ToastError)
    _check_identify_all(pickle.loads(pickle.dumps(raised.value)))  # as a worker process hands it back


@pytest.mark.parametrize("engine", engines())
def test_toast_analyze_raises_on_an_unknown_kernel_class(engine, tmp_path):
    with pytest.raises(InvalidRules) as raised:
        analyze("tiny", fn=jnp.tanh, args=[X], engine=engine, rules=_rules(tmp_path, BOGUS_CLASS))
    assert re.fullmatch(KERNEL_CLASS_LINE, str(raised.value))
    assert {(row.check, row.detail) for row in raised.value.rows} == {
        ("kernel_class_twice", "stablehlo.dot_general: bogus and matmul"),
        ("kernel_class_twice", "stablehlo.dot_general: matmul and bogus"),
        ("kernel_class_unknown", "stablehlo.dot_general: bogus")}


def test_the_rows_are_there_for_whoever_asks_for_them(tmp_path):
    """``check_invariants=False``: the analysis with its rows (the invariants' own tests read them so)."""
    analysis = analyze("tiny", fn=jnp.tanh, args=[X], engine="embedded", rules=_rules(tmp_path, BOGUS_CLASS),
                       check_invariants=False)
    assert len(analysis.invalid) == 3
    assert analyze("tiny", fn=jnp.tanh, args=[X], engine="embedded").invalid == ()  # sound rules: no error


def test_autoshard_raises_before_the_search(tmp_path):
    with pytest.raises(InvalidRules) as raised:
        autoshard(jnp.tanh, X, mesh="d=2", engine="embedded", rules=_rules(tmp_path, BOGUS_CLASS), rollouts=10)
    assert re.fullmatch(KERNEL_CLASS_LINE, str(raised.value))


def test_a_cached_analysis_with_failed_invariants_raises_too(tmp_path, monkeypatch):
    monkeypatch.setenv("TOAST_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TOAST_NO_CACHE", raising=False)
    rules = _rules(tmp_path, BOGUS_CLASS)
    outcomes: list[object] = []
    for check in (True, True, False):  # one line: JAX's locations, part of the program's text, stay the same
        try:
            outcomes.append(analyze("tiny", fn=jnp.tanh, args=[X], engine="embedded", rules=rules,
                                    check_invariants=check))
        except InvalidRules as err:
            outcomes.append(err)
    first, second, unchecked = outcomes
    assert isinstance(first, InvalidRules) and isinstance(second, InvalidRules)
    assert str(first) == str(second)
    assert not isinstance(unchecked, InvalidRules)
    assert unchecked.stats["cache"] == "hit" and len(unchecked.invalid) == 3  # the rows came from the cache


# ---- the command line ---------------------------------------------------------------------------------------------

COMMANDS = {
    "analyze": ["analyze", "invalid_rows_tiny:tiny", "--json", "OUT"],
    "autoshard": ["autoshard", "invalid_rows_tiny:tiny", "--mesh", "d=2", "--workers", "1", "--rollouts", "10",
                  "-o", "OUT"],
    "cost": ["cost", "invalid_rows_tiny:tiny", "--hardware", "h100", "--mesh", "d=2", "--json", "OUT"],
}


@pytest.fixture
def tiny_module(tmp_path, monkeypatch):
    """``invalid_rows_tiny:tiny``, the program above, found in the current directory."""
    (tmp_path / "invalid_rows_tiny.py").write_text(TINY_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def _fails(command: str, rules: Path, engine: str, tmp_path: Path, capsys) -> str:
    out = tmp_path / "out.json"
    argv = [str(out) if word == "OUT" else word for word in COMMANDS[command]]
    assert main([*argv, "--engine", engine, "--rules", str(rules)]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if not line.startswith("toast: compiling")]
    assert captured.out == "" and not out.exists()  # nothing searched, priced or written
    assert len(lines) == 1, lines
    return lines[0].removeprefix("toast: error: ")


@pytest.mark.parametrize("engine", engines())
def test_toast_analyze_fails_on_an_identity_of_names_of_different_sizes(engine, tmp_path, tiny_module, capsys):
    line = _fails("analyze", _rules(tmp_path, IDENTIFY_ALL), engine, tmp_path, capsys)
    assert re.fullmatch(IDENTIFY_ALL_LINE, line), line


@pytest.mark.parametrize("engine", engines())
def test_toast_analyze_fails_on_an_unknown_kernel_class(engine, tmp_path, tiny_module, capsys):
    line = _fails("analyze", _rules(tmp_path, BOGUS_CLASS), engine, tmp_path, capsys)
    assert re.fullmatch(KERNEL_CLASS_LINE, line), line


@pytest.mark.parametrize("command", ["autoshard", "cost"])
@pytest.mark.parametrize("text", [IDENTIFY_ALL, BOGUS_CLASS], ids=["ident_size", "kernel_class"])
def test_autoshard_and_cost_fail_before_searching_or_pricing(command, text, tmp_path, tiny_module, capsys):
    line = _fails(command, _rules(tmp_path, text), "embedded", tmp_path, capsys)
    assert re.fullmatch(IDENTIFY_ALL_LINE if text == IDENTIFY_ALL else KERNEL_CLASS_LINE, line), line
