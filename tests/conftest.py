"""Shared fixtures: engines to run, and cached analyses of the bundled examples."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from toast.datalog.souffle import souffle_binary

# Tests analyze afresh (a cached analysis would hide an engine's time limit, or a rule file a test changed),
# and never touch the user's cache: tests/test_analysis_cache.py turns it on in a folder of its own.
os.environ["TOAST_NO_CACHE"] = "1"
os.environ["TOAST_CACHE_DIR"] = tempfile.mkdtemp(prefix="toast-test-cache-")
atexit.register(shutil.rmtree, os.environ["TOAST_CACHE_DIR"], ignore_errors=True)


def _load_goldens():
    """``tests/golden/regenerate.py``, the golden format and comparison (module ``toast_goldens``)."""
    spec = importlib.util.spec_from_file_location("toast_goldens", Path(__file__).parent / "golden" / "regenerate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


goldens = _load_goldens()

SOUFFLE_MISSING = "souffle is not on PATH (not in any package registry; build it from source to run these)"


def engines() -> list:
    """The embedded engine always; Soufflé when installed, else a skipped parameter."""
    souffle = pytest.param("souffle", marks=pytest.mark.skipif(souffle_binary() is None, reason=SOUFFLE_MISSING))
    return ["embedded", souffle]


def analysis_of(spec: str, engine: str = "embedded"):
    """``toast.analyze`` of a bundled example, computed once per test session."""
    return kept_analysis_of(spec, engine)[0]


@functools.cache
def kept_analysis_of(spec: str, engine: str = "embedded"):
    """``(analysis, outputs)``: ``toast.analyze`` of a bundled example and the engine outputs of
    both stages in golden form (``goldens.Outputs``: stage -> relation -> canonical rows), read
    from what the engine wrote under ``keep``; computed once per test session and shared with
    ``analysis_of``, so the golden tests reuse the analyses other tests make."""
    return goldens.analyze_kept(spec, engine)


def walk_atoms(space, rng) -> object:
    """The atom masks after a seeded random walk of 1 to 6 valid actions of ``space`` (an ``ActionSpace``): at
    each step the first valid action of a random permutation."""
    atoms = space.initial_atoms
    for _ in range(int(rng.integers(1, 7))):
        for index in rng.permutation(len(space)).tolist():
            following = space.step(atoms, index)
            if following is not None:
                atoms = following
                break
    return atoms


def assert_like(new, old) -> None:
    """Two pytrees of arrays (or ``ShapeDtypeStruct``s) with one structure, leaf shapes and dtypes: what a
    training step returns for what it takes (new parameters, new optimizer state)."""
    import jax

    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(old)
    for new_leaf, old_leaf in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(old), strict=True):
        assert (new_leaf.shape, new_leaf.dtype) == (old_leaf.shape, old_leaf.dtype)


ROUND_NUMBERS = """\
[compute]
bf16 = 1e12
f32 = 1e12
sources = ["round numbers"]
[memory]
hbm_bytes = 1e12
hbm_bandwidth = 1e12
sources = ["round numbers"]
[kernels]
matmul_efficiency = 1.0
matmul_overhead = 1e-6
f32_matmul = "f32"
hbm_efficiency = 1.0
kernel_overhead = 1e-6
step_overhead = 1e-5
scatter_add_rate = 1e9
scatter_add_rate_16bit = 5e8
sources = ["round numbers"]
[compiler]
combine_threshold = 0
sources = ["round numbers: nothing combined unless a test says so"]
"""
"""The sections of a hand-computed tests' profile before its levels: 1e12 FLOP/s, 1e12 B/s of HBM at 100%, 1 us
per kernel and per library call, 10 us per step, no combining."""


# One NVLink-like level of 8 devices, 100 GB/s, 1 us: the interconnect of the one-level test profiles.
ONE_LEVEL = """\
[[interconnect]]
level = "nvlink"
devices = 8
bandwidth = 1e11
latency = 1e-6
efficiency = 1.0
small_latency = 1e-6
small_efficiency = 1.0
switch_reduction = false
sources = ["round numbers"]
"""


def round_numbers_profile(name: str, levels: str) -> str:
    """A profile's text: ``name``, ``ROUND_NUMBERS`` and the ``[[interconnect]]`` tables ``levels``."""
    return f'name = "{name}"\ndescription = "round numbers for hand-computed tests"\n{ROUND_NUMBERS}{levels}'

