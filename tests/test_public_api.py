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
