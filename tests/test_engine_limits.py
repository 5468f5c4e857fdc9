"""``--timeout`` holds on both engines (issue 11); Soufflé's one-time compile is not part of it."""

from __future__ import annotations

import pytest
from conftest import SOUFFLE_MISSING

import toast
from toast.cli import main
from toast.datalog.souffle import souffle_binary

GPT = "toast.examples.gpt:gpt_small"


# The time limit is an interval timer's signal: where it lands in JAX's garbage-collection callback, Python reports
# the exception as ignored, and the timer, repeating every 50 ms, stops the engine on its next tick.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_embedded_engine_stops_at_the_timeout(capsys):
    assert main(["analyze", GPT, "--engine", "embedded", "--timeout", "0.05"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["toast: error: the embedded engine timed out after 0.05 s; raise --timeout"]
    # The engine's state is clean afterwards: the next analysis runs to the end.
    assert len(toast.analyze("toast.examples.mlp:mlp", engine="embedded").colors) == 4


@pytest.mark.souffle
@pytest.mark.skipif(souffle_binary() is None, reason=SOUFFLE_MISSING)
def test_souffle_runs_are_limited_but_not_its_compile(capsys):
    toast.analyze(GPT, engine="souffle")  # compiled (and cached) here, whatever the limit
    assert main(["analyze", GPT, "--engine", "souffle", "--timeout", "0.001"]) == 2
    assert "timed out after 0.001 s" in capsys.readouterr().err
