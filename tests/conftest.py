"""Shared fixtures: engines to run, and cached analyses of the bundled examples."""

from __future__ import annotations

import functools

import pytest

from toast.datalog.souffle import souffle_binary

SOUFFLE_MISSING = "souffle is not on PATH (not in any package registry; build it from source to run these)"


def engines() -> list:
    """The embedded engine always; Soufflé when installed, else a skipped parameter."""
    souffle = pytest.param("souffle", marks=pytest.mark.skipif(souffle_binary() is None, reason=SOUFFLE_MISSING))
    return ["embedded", souffle]


@functools.lru_cache(maxsize=None)
def analysis_of(spec: str, engine: str = "embedded"):
    """``toast.analyze`` of a bundled example, computed once per test session."""
    from toast import analyze

    return analyze(spec, engine=engine)
