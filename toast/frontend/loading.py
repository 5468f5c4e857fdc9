"""The program to analyze, from what a user names: a ``.mlir`` file, a ``module:function``
factory, or a JAX callable with example arguments.

A factory is a function that returns ``(fn, example_args)`` (the bundled examples in
``toast.examples`` are factories), or ``(module, example_inputs)``: a ``torch.nn.Module`` and its
``forward``'s arguments (a tuple, or a dict of keyword tensors), whose training step
``torch_step.training_step`` traces through torchax (``pip install 'toast[torch]'``; a module is
recognized without importing torch). ``resolve_factory`` is the one place a ``module:function``
spec becomes a callable; it uses the standard library's ``pkgutil.resolve_name``.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from toast.errors import InputError, ToastError
from toast.frontend import stablehlo, torch_locations, torch_step
from toast.frontend.ir import Program


def resolve_factory(spec: str) -> Callable[..., Any]:
    """The callable named by ``module:function`` (``function`` may be dotted). A module that is
    not importable from ``sys.path`` is looked for in the current directory too, as
    ``python -m`` would find it.

    Raises:
      InputError: not ``module:function``, the module cannot be imported, or it has no such
        callable (the message lists the ones it has).
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"{spec}: not module:function (e.g. toast.examples.mlp:mlp)")
    try:
        module = _import(module_name)
    except ImportError as err:
        raise InputError(f"{spec}: cannot import module '{module_name}': {err}") from None
    try:
        found = pkgutil.resolve_name(spec)
    except (AttributeError, ValueError, ImportError):
        found = None
    if not callable(found):
        known = sorted(name for name, value in vars(module).items()
                       if callable(value) and not name.startswith("_")
                       and getattr(value, "__module__", None) == module.__name__)
        raise InputError(f"{spec}: module '{module_name}' has no function '{attr}' "
                         f"(it has: {', '.join(known) or 'none'})")
    return found


def _import(module_name: str) -> ModuleType:
    """Import ``module_name``, from the current directory if it is found nowhere else."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        if err.name != module_name.split(".")[0] or here in sys.path:
            raise
        sys.path.append(here)  # after the installed packages: it never shadows them
        return importlib.import_module(module_name)


def parse_factory_arguments(text: str) -> dict[str, Any]:
    """Keyword arguments of a factory, ``layers=12&batch=8`` (the part of a ``module:function``
    spec after ``?``) or one ``--arg layers=12``: values are Python literals (numbers, strings,
    ``True``, tuples), else taken as strings.

    Raises:
      InputError: an entry is not ``NAME=VALUE`` with NAME an identifier.
    """
    found: dict[str, Any] = {}
    for entry in filter(None, text.split("&")):
        name, sep, value = entry.partition("=")
        if not sep or not name.isidentifier():
            raise InputError(f"factory argument '{entry}' should be NAME=VALUE, e.g. layers=12")
        try:
            found[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            found[name] = value
    return found


def load_program(source: str, *, args: Sequence[Any] | None = None, fn: Callable[..., Any] | None = None,
                 factory_arguments: Mapping[str, Any] | None = None) -> Program:
    """Read ``source``: a ``.mlir`` file, ``module:function[?NAME=VALUE&...]`` naming a factory
    (called with those keyword arguments and ``factory_arguments``; one returning a PyTorch module
    gives its training step), or ``fn``+``args`` (``source`` is then only the program's label)."""
    text, name = load_program_text(source, args=args, fn=fn, factory_arguments=factory_arguments)
    return stablehlo.read_text(text, source=name)


def load_program_text(source: str, *, args: Sequence[Any] | None = None, fn: Callable[..., Any] | None = None,
                      factory_arguments: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """``load_program``'s first half: the StableHLO text of ``source`` (a file's, or lowered with
    ``jax.jit``) and the name to read it under, ``(text, name)``; nothing is parsed yet."""
    if fn is not None:
        return _lowered(fn, args or (), source), source or getattr(fn, "__name__", "fn")
    if source.endswith(".mlir") or Path(source).is_file():
        return stablehlo.file_text(source), source
    if ":" not in source:
        raise InputError(f"{source}: not a .mlir file and not module:function")
    spec, _, query = source.partition("?")
    keywords = {**parse_factory_arguments(query), **(factory_arguments or {})}
    factory = resolve_factory(spec)
    try:
        made = factory(**keywords)
    except TypeError as err:
        raise InputError(f"{source}: cannot call the factory with {keywords or 'no arguments'}: {err}") from None
    except ModuleNotFoundError as err:  # a PyTorch factory without the extra, or a package of the user's
        hint = f": {torch_step.INSTALL}" if err.name in torch_step.EXTRA_PACKAGES else ""
        raise InputError(f"{source}: the factory imports {err.name or 'a package'}, which is not installed"
                         f"{hint}") from None
    except ToastError:
        raise
    except Exception as err:
        raise InputError(f"{source}: the factory failed: {_first_line(err)}") from None
    if isinstance(made, tuple) and len(made) == 2 and torch_step.is_torch_module(made[0]):
        return _lowered_torch(made[0], made[1], source), source
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise InputError(f"{source}: the factory must return (function, example_arguments) "
                         "or (torch.nn.Module, example_inputs)")
    function, example_args = made
    return _lowered(function, tuple(example_args), source), source


def _lowered(function: Callable[..., Any], example_args: Sequence[Any], source: str) -> str:
    """``stablehlo.lower_callable``, a JAX tracing error in the user's function as one line."""
    try:
        return stablehlo.lower_callable(function, example_args)
    except ToastError:
        raise
    except Exception as err:
        raise InputError(f"{source}: lowering with jax.jit failed: {_first_line(err)}") from None


def _lowered_torch(module: Any, example_inputs: Any, source: str) -> str:
    """The StableHLO text of ``module``'s training step (``torch_step.training_step``: its ``.loss``, AdamW),
    traced through torchax, its locations in the model's code (``torch_locations``); an error, the user's or
    PyTorch's, as one line that names ``source``."""
    try:
        function, example_args = torch_step.training_step(module, example_inputs)
        return torch_locations.lower_torch_step(function, example_args)
    except InputError as err:
        raise InputError(f"{source}: {err}") from None
    except ToastError:
        raise
    except Exception as err:
        raise InputError(f"{source}: tracing the PyTorch model through torchax failed: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
