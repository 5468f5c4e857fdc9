"""The program to analyze, from what a user names: a ``.mlir`` file, a ``module:function``
factory, or a JAX callable with example arguments.

A factory is a function that returns ``(fn, example_args)`` (the bundled examples in
``toast.examples`` are factories). ``resolve_factory`` is the one place a ``module:function``
spec becomes a callable; it uses the standard library's ``pkgutil.resolve_name``.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toast.errors import InputError, ToastError
from toast.frontend import stablehlo
from toast.frontend.ir import Program


def resolve_factory(spec: str) -> Callable[..., Any]:
    """The callable named by ``module:function`` (``function`` may be dotted).

    Raises:
      InputError: not ``module:function``, the module cannot be imported, or it has no such
        callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"{spec}: not module:function (e.g. toast.examples.mlp:mlp)")
    try:
        found = pkgutil.resolve_name(spec)
    except ImportError as err:
        raise InputError(f"{spec}: cannot import module '{module_name}': {err}") from None
    except (AttributeError, ValueError):
        raise InputError(f"{spec}: module '{module_name}' has no function '{attr}'") from None
    if not callable(found):
        raise InputError(f"{spec}: '{attr}' in module '{module_name}' is not a function")
    return found


def load_program(source: str, *, args: Sequence[Any] | None = None, fn: Callable[..., Any] | None = None) -> Program:
    """Read ``source``: a ``.mlir`` file, ``module:function`` naming a factory, or ``fn``+``args``
    (``source`` is then only the program's label)."""
    if fn is not None:
        return stablehlo.read_callable(fn, args or (), name=source)
    if source.endswith(".mlir") or Path(source).is_file():
        return stablehlo.read_file(source)
    if ":" not in source:
        raise InputError(f"{source}: not a .mlir file and not module:function")
    made = resolve_factory(source)()
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise InputError(f"{source}: the factory must return (function, example_arguments)")
    function, example_args = made
    try:
        return stablehlo.read_callable(function, tuple(example_args), name=source)
    except ToastError:
        raise
    except Exception as err:  # a JAX tracing error in the user's function
        raise InputError(f"{source}: lowering with jax.jit failed: {type(err).__name__}: "
                         f"{str(err).splitlines()[0]}") from None
