"""A PyTorch model's step lowered with locations in the model's code, not in torchax's.

JAX writes each op's location as its Python traceback, innermost frame first
(``jax_include_full_tracebacks_in_locations``, on by default; JAX leaves its own frames out)::

    NameLoc("jit(step)/jvp(linear)/dot_general",
            CallSiteLoc(<torchax/ops/jtorch.py:495>, CallSiteLoc(<torch/nn/modules/linear.py:134>,
            CallSiteLoc(<transformers/.../modeling_llama.py:236>, ... <toast/frontend/torch_step.py:365>, ...))))

For a model traced through torchax every op's innermost frames are torchax's and torch's, and its outermost ones are
toast's and whatever called toast (the ``toast`` script, a test), none of which the user wrote. ``model_locations``
rewrites each op's traceback to the frames of the model's own code: the frames between the call into the model (toast's
``torch_step``, where the walk stops) and the first frame of torch, torchax, JAX, optax or Python's library. The op
keeps its name and the model's frames, innermost first, so ``stablehlo.python_location`` (user code before a library
in site-packages, else the innermost) reads the model's line: ``modeling_llama.py:236`` for the ``q_proj`` matmul, the
user's ``forward`` for a module of their own. An op no model frame made gets the line of toast's ``torch_step`` that
made it (AdamW's update, the loss's reshape); one whose traceback does not pass through the step (a constant JAX hoists
out of it, such as a buffer, located at the ``jit`` call; an op of a jitted jnp function whose body JAX cached from an
earlier trace in the process, located where that trace called it) keeps its name without a frame; one without a
traceback keeps its location.
With ``jax_include_full_tracebacks_in_locations`` off, JAX writes one frame per op, torchax's: the model's ops then
have no line (rather than torchax's).

Only the torch path uses this (JAX programs keep JAX's locations), on the module ``jax.jit(fn).lower`` built; each
distinct location is rewritten once (MLIR uniques them; the callers' chains are shared), so the cost is linear in the
program's size (0.29 s for the 28,854 ops of a 40-layer tiny Llama's step, whose lowering takes 15.6 s).
"""

from __future__ import annotations

import importlib.util
import io
import os
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Frames of these packages are how the model runs, not the model: PyTorch (its modules, functional_call), torchax (its
# dispatch and lowerings of aten ops), JAX (which leaves its own out already; jaxlib in case) and optax (the optimizer).
MACHINERY_PACKAGES = ("torch", "torchax", "jax", "jaxlib", "optax")

_TOAST_DIR = str(Path(__file__).resolve().parent.parent)
_EXAMPLES_DIR = os.path.join(_TOAST_DIR, "examples")
_STEP_FILE = os.path.join(_TOAST_DIR, "frontend", "torch_step.py")
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"])


def lower_torch_step(fn: Callable[..., Any], args: Sequence[Any]) -> str:
    """``torch_step.training_step``'s ``fn(*args)`` lowered with ``jax.jit`` as StableHLO text with debug locations
    (as ``stablehlo.lower_callable``), the ops' locations rewritten to the model's frames (``model_locations``)."""
    import jax
    from jaxlib.mlir import ir

    lowered = jax.jit(fn).lower(*args)
    module = lowered.compiler_ir("stablehlo")
    if not isinstance(module, ir.Module):  # compiler_ir promises no type: keep JAX's locations rather than fail
        return lowered.as_text(debug_info=True)
    model_locations(module)
    text = io.StringIO()
    module.operation.print(file=text, enable_debug_info=True)  # what Lowered.as_text(debug_info=True) prints
    return text.getvalue()


@dataclass(frozen=True, slots=True)
class _Chain:
    """What a traceback (or its outer part) holds: ``model``, the model's frames as one location (``None``: none);
    ``step``, the frame of ``torch_step`` the walk stopped at (``None``: it stopped elsewhere or never)."""

    model: Any
    step: Any


def model_locations(module: Any) -> None:
    """Rewrite, in place, the location of every op in ``module`` (an ``ir.Module``, nested regions and private
    functions included) to its op name over the model's frames (see the module's docstring)."""
    from jaxlib.mlir import ir

    rewriter = _Rewriter(ir, _machinery_dirs())
    with module.context:
        module.operation.walk(rewriter.visit)


class _Rewriter:
    """The rewrite of ``model_locations``, memoized by location (MLIR uniques them: a program of 70k ops has a few
    thousand distinct chains, most of them sharing their callers)."""

    def __init__(self, ir: Any, machinery: tuple[str, ...]) -> None:
        self.ir = ir
        self.machinery = machinery
        self.ops: dict[Any, Any] = {}  # an op's location (as an attribute) -> its new location
        self.chains: dict[Any, _Chain] = {}  # a CallSiteLoc -> what it holds
        self.kinds: dict[str, str] = {}  # a file name -> its kind (``_kind``)

    def visit(self, op: Any) -> Any:
        location = op.location
        key = location.attr
        if key in self.ops:
            new = self.ops[key]
        else:
            new = self.ops[key] = self._relocated(location)
        if new is not None:
            op.location = new
        return self.ir.WalkResult.ADVANCE

    def _relocated(self, location: Any) -> Any:
        """``location`` with its traceback replaced by the model's frames (else ``torch_step``'s frame, else none);
        ``None`` where it has no traceback (it stays)."""
        ir = self.ir
        name = None
        trace = location
        if isinstance(location, ir.NameLoc):  # JAX names the op ("jit(step)/jvp(linear)/dot_general") over its trace
            name, trace = location.name_str, location.child_loc
        if not (isinstance(trace, ir.CallSiteLoc) or self._is_frame(trace)):
            return None
        chain = self._chain(trace)
        if chain.step is None:
            # Not made under toast's step: a constant JAX hoists to the jit call, or an op of a jitted library
            # function (jnp's) whose traced body JAX cached from an earlier trace in this process, with that
            # trace's traceback (another program's line); neither is the model's.
            frames = ir.Location.unknown()
        else:
            frames = chain.model if chain.model is not None else chain.step
        return ir.Location.name(name, childLoc=frames) if name is not None else frames

    def _is_frame(self, location: Any) -> bool:
        """One Python frame: ``NameLoc("Function.name", FileLineColLoc)`` as JAX writes it, or a bare file:line."""
        ir = self.ir
        return isinstance(location, ir.FileLineColLoc) or (
            isinstance(location, ir.NameLoc) and isinstance(location.child_loc, ir.FileLineColLoc))

    def _chain(self, trace: Any) -> _Chain:
        """The model's frames of ``trace``, a frame or ``CallSiteLoc(frame, outer trace)``; iterative (a traceback
        is up to ``jax_traceback_in_locations_limit`` frames, 1000 when unlimited), each CallSiteLoc once."""
        ir = self.ir
        spine: list[Any] = []  # the CallSiteLocs not yet known, innermost first
        node = trace
        outer: _Chain | None = None
        while isinstance(node, ir.CallSiteLoc):
            known = self.chains.get(node.attr)
            if known is not None:
                outer = known
                break
            callee = node.callee
            if self._is_frame(callee) and self._kind(callee) in ("step", "toast"):
                outer = self.chains[node.attr] = self._frame_chain(callee)  # toast called the model: stop here
                break
            spine.append(node)
            node = node.caller
        if outer is None:  # the outermost frame
            outer = self._frame_chain(node)
        for link in reversed(spine):
            inner = self._frame_chain(link.callee)
            if inner.model is None:
                chain = outer
            elif outer.model is None:
                chain = _Chain(inner.model, outer.step)
            else:
                chain = _Chain(ir.Location.callsite(inner.model, [outer.model]), outer.step)
            self.chains[link.attr] = outer = chain
        return outer

    def _frame_chain(self, frame: Any) -> _Chain:
        """What one frame (or a location that is none: no frame) holds."""
        if not self._is_frame(frame):
            return _Chain(None, None)
        kind = self._kind(frame)
        if kind == "model":
            return _Chain(frame, None)
        return _Chain(None, frame if kind == "step" else None)

    def _kind(self, frame: Any) -> str:
        """``"step"`` (``torch_step``, which calls the model, the loss and the optimizer), ``"toast"`` (the rest of
        toast, its examples aside), ``"machinery"`` (``MACHINERY_PACKAGES``, Python's library,
        generated code such as ``<string>``) or ``"model"``."""
        filename = (frame if isinstance(frame, self.ir.FileLineColLoc) else frame.child_loc).filename
        kind = self.kinds.get(filename)
        if kind is None:
            kind = self.kinds[filename] = _file_kind(filename, self.machinery)
        return kind


def _file_kind(filename: str, machinery: tuple[str, ...]) -> str:
    if filename.startswith("<"):
        return "machinery"
    path = os.path.realpath(filename)
    if path == _STEP_FILE:
        return "step"
    if path.startswith(_TOAST_DIR + os.sep) and not path.startswith(_EXAMPLES_DIR + os.sep):
        return "toast"
    if any(path.startswith(directory + os.sep) for directory in machinery):
        return "machinery"
    # Python's library, but not the packages installed in it (a Python without a virtual environment keeps
    # site-packages under its library: transformers there is the model's code)
    parts = path.split(os.sep)
    if path.startswith(_STDLIB_DIR + os.sep) and "site-packages" not in parts and "dist-packages" not in parts:
        return "machinery"
    return "model"


def _machinery_dirs() -> tuple[str, ...]:
    """The directories of the ``MACHINERY_PACKAGES`` that are installed, as real paths."""
    found: list[str] = []
    for name in MACHINERY_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found.extend(spec.submodule_search_locations)
    return tuple(os.path.realpath(directory) for directory in found)
