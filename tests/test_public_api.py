"""The public API: every name in ``toast.__all__`` exists, and the module's example runs."""

from __future__ import annotations

import doctest

import toast


def test_every_exported_name_exists():
    missing = [name for name in toast.__all__ if not hasattr(toast, name)]
    assert not missing


def test_the_package_docstring_example_runs():
    """Analysis, mesh, roles, a strategy and its cost, through ``toast.*`` only."""
    result = doctest.testmod(toast, verbose=False)
    assert result.attempted >= 8
    assert result.failed == 0


def test_public_names_are_the_functions_whatever_was_imported_first():
    """``toast.output.autoshard`` is a module and ``toast.autoshard`` the function in it, in either order."""
    import importlib

    import toast

    module = importlib.import_module("toast.output.autoshard")
    assert callable(toast.autoshard) and toast.autoshard is module.autoshard
    assert toast.sharded_jit is importlib.import_module("toast.output.sharded_jit").sharded_jit


BAD_MEMORY = [float("nan"), float("inf"), float("-inf"), 0.0, -1.0, 2.0**30 + 1, True, "16"]


def _one_line_error(call) -> str:
    try:
        call()
    except toast.ToastError as err:
        assert "\n" not in str(err), str(err)
        return str(err)
    raise AssertionError("no error")


def test_a_memory_limit_that_is_not_a_positive_finite_number_is_refused_by_every_entry_point():
    """A NaN limit compared false with every peak, so nothing was ever over it (``over_memory == False``). The
    API and ``--memory`` take the same limits: above 0, finite, at most 2**30 GiB (an exbibyte per device)."""
    import argparse

    import pytest

    from toast.cli.options import memory_gib
    from toast.evaluation.sweep import Job
    from toast.examples.mlp import mlp

    fn, args = mlp()
    for bad in BAD_MEMORY:
        message = _one_line_error(lambda bad=bad: toast.autoshard(fn, *args, mesh="batch=8", memory_gib=bad,
                                                                  engine="embedded", rollouts=5))
        assert message == (f"memory_gib {bad!r}: give the memory per device in GiB, a number above 0 and at most "
                           "1073741824")
        assert "memory_gib" in _one_line_error(lambda bad=bad: Job("mlp", "batch=8", "a100_80gb", bad, 0, 5))
        if isinstance(bad, float):  # what the command line can be given
            with pytest.raises(argparse.ArgumentTypeError, match="give the memory per device in GiB"):
                memory_gib(str(bad))
    for good in (2.0**30, 1e-6, 16):  # the largest limit, a tiny one, an int
        assert memory_gib(str(good)) == float(good)
        assert Job("mlp", "batch=8", "a100_80gb", good, 0, 5).memory_gib == good


def test_compare_and_the_cost_model_refuse_a_nan_memory_limit():
    from conftest import analysis_of

    analysis = analysis_of("toast.examples.mlp:mlp")
    mesh, hardware = toast.parse_mesh("batch=8"), toast.load_hardware("a100_80gb")
    budget = toast.Budget(seed=0, rollouts=5, workers=1)
    message = _one_line_error(lambda: toast.compare(analysis, mesh, hardware, source="mlp", roles=None,
                                                    budget=budget, memory_gib=float("nan")))
    assert message.startswith("memory_gib nan: give the memory per device in GiB")
    model = toast.ShardingModel(analysis, mesh)
    for bad in (float("nan"), float("inf"), 0.0, -5.0):
        message = _one_line_error(lambda bad=bad: toast.CostModel(model, hardware, device_memory=bad))
        assert message == f"device memory {bad!r}: give the memory per device in bytes, a finite number above 0"


_STRATEGY_OBJECT_SCRIPT = """
import json, sys
import jax, numpy as np
import toast
from toast.examples.mlp import mlp
fn, args = mlp()
strategy = toast.autoshard(fn, *args, mesh="batch=2,model=2", rollouts=20, engine="embedded")
strategy.save(sys.argv[1])
rng = np.random.default_rng(0)
real = [rng.standard_normal(a.shape).astype(np.float32) for a in args]
want = np.asarray(jax.jit(fn)(*real))
runs = {"autoshard": toast.sharded_jit(strategy, fn),  # its example arguments
        "loaded": toast.sharded_jit(toast.load_strategy(sys.argv[1]), fn, args)}
outs = {name: run(*real) for name, run in runs.items()}
try:
    toast.sharded_jit(toast.load_strategy(sys.argv[1]), fn)
    missing = "no error"
except toast.ToastError as err:
    missing = str(err)
print(json.dumps({"close": {name: bool(np.allclose(out, want, rtol=1e-5, atol=1e-5)) for name, out in outs.items()},
                  "devices": sorted({len(out.sharding.device_set) for out in outs.values()}), "missing": missing}))
"""


def test_sharded_jit_takes_the_strategy_autoshard_and_load_strategy_return(tmp_path):
    """``toast.sharded_jit`` runs a ``toast.Strategy`` (from ``autoshard``, or read back by ``load_strategy``) on 4
    host devices and gives ``jax.jit``'s result."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_NUM_CPU_DEVICES="4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", _STRATEGY_OBJECT_SCRIPT, str(tmp_path / "s.json")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"close": {"autoshard": True, "loaded": True}, "devices": [4],
                      "missing": "sharded_jit(strategy, fn, args): give the example arguments the strategy was made "
                                 "for (a strategy read from a file does not hold them)"}


def test_sharded_jit_names_what_is_not_a_strategy():
    import pytest

    from toast.examples.mlp import mlp

    fn, args = mlp()
    with pytest.raises(toast.ToastError, match=r"^sharded_jit: not a strategy: int \(give a toast.Strategy, a "):
        toast.sharded_jit(5, fn, args)
