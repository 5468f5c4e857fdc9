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
