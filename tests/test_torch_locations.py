"""``toast.frontend.torch_locations`` on hand-written MLIR locations (no torch needed): each op's traceback becomes
the frames of the model's code, found between toast's ``torch_step`` (where the walk stops: its callers are not the
model) and the frames of torch, torchax, JAX, optax and Python's library; the op keeps its name. The same rewrite on a
real model (the tiny Hugging Face Llama, a module of a test's own) is tested in ``tests/test_torch_frontend.py``."""

from __future__ import annotations

import io
import os

import jax
import pytest
from jax.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir

from toast.frontend import stablehlo, torch_locations, torch_step

JAX_FILE = os.path.join(os.path.dirname(os.path.realpath(jax.__file__)), "_src", "numpy", "ufuncs.py")
STEP_FILE = os.path.realpath(torch_step.__file__)
LOWERING_FILE = os.path.realpath(torch_locations.__file__)  # toast, but not the step: its frames are no one's
MODEL_FILE = "/home/user/project/model.py"
LIBRARY_MODEL_FILE = "/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py"
RUN_FILE = "/home/user/project/run.py"  # the script that called toast
EXAMPLE_FILE = os.path.join(os.path.dirname(STEP_FILE), "..", "examples", "convnet.py")  # a model's code


def _frame(name, filename, line):
    return f'"{name}"("{filename}":{line}:1)'


def _trace(*frames):
    """A JAX traceback location (MLIR's syntax inside ``loc(...)``): ``callsite(innermost at callsite(... at
    outermost))``, a frame ``"function"("file":line:col)``."""
    trace = frames[-1]
    for frame in reversed(frames[:-1]):
        trace = f"callsite({frame} at {trace})"
    return trace


def _rewritten(traces):
    """Each trace as the location of one op (named ``jit(step)/op<i>``) of a module; the op locations
    ``stablehlo.read_text`` gives after ``model_locations``, and the module's text."""
    ops = "\n".join(f'    %{i + 1} = stablehlo.add %{i if i else "arg0"}, %arg0 : tensor<2xf32> '
                    f'loc("jit(step)/op{i}"({trace}))' for i, trace in enumerate(traces))
    text = (f'module @jit_step {{\n  func.func public @main(%arg0: tensor<2xf32> loc("x")) -> tensor<2xf32> {{\n'
            f"{ops}\n    return %{len(traces)} : tensor<2xf32>\n  }}\n}}\n")
    context = jax_mlir.make_ir_context()
    module = ir.Module.parse(text, context=context)
    torch_locations.model_locations(module)
    printed = io.StringIO()
    module.operation.print(file=printed, enable_debug_info=True)
    program = stablehlo.read_text(printed.getvalue(), source="step")
    return [op.loc for op in program.ops if op.kind == "stablehlo.add"], printed.getvalue()


@pytest.mark.parametrize("frames, expected", [
    # torchax's lowering, torch's Linear, the user's forward, toast's step, the user's script: the forward's line
    ((("jtorch", JAX_FILE, 495), ("forward", MODEL_FILE, 12), ("loss_of", STEP_FILE, 365), ("<module>", RUN_FILE, 3)),
     f"{MODEL_FILE}:12"),
    # a library's model (site-packages) called by the user's module: the user's line, as for a JAX program
    ((("jtorch", JAX_FILE, 495), ("LlamaAttention.forward", LIBRARY_MODEL_FILE, 236), ("forward", MODEL_FILE, 20),
      ("loss_of", STEP_FILE, 365), ("<module>", RUN_FILE, 3)), f"{MODEL_FILE}:20"),
    # only a library's model: its innermost line, not the script's (the outermost frame, outside site-packages)
    ((("jtorch", JAX_FILE, 495), ("LlamaAttention.forward", LIBRARY_MODEL_FILE, 236),
      ("LlamaModel.forward", LIBRARY_MODEL_FILE, 395), ("loss_of", STEP_FILE, 365), ("<module>", RUN_FILE, 3)),
     f"{LIBRARY_MODEL_FILE}:236"),
    # no model frame (the optimizer's update): toast's step line
    ((("adam", JAX_FILE, 40), ("step", STEP_FILE, 375), ("<module>", RUN_FILE, 3)), f"{STEP_FILE}:375"),
    # made outside the step (a constant hoisted at the jit call): no line rather than the caller's
    ((("lower_torch_step", LOWERING_FILE, 50), ("<module>", RUN_FILE, 3)), ""),
    # a jitted jnp function's body JAX cached from an earlier trace in the process (a JAX example's line), called
    # from toast's lowering of that program: not through the step, so no line rather than the other program's
    ((("clip", JAX_FILE, 80), ("conv_block", EXAMPLE_FILE, 53), ("lower_callable", LOWERING_FILE, 51),
      ("<module>", RUN_FILE, 3)), ""),
    # generated code ("<string>") and Python's library are not the model's
    ((("__init__", "<string>", 2), ("forward", MODEL_FILE, 7), ("loss_of", STEP_FILE, 365)), f"{MODEL_FILE}:7"),
])
def test_an_ops_location_is_the_models_frame(frames, expected):
    locations, _ = _rewritten([_trace(*(_frame(*frame) for frame in frames))])
    assert locations == [expected]


def test_ops_keep_their_names_and_share_rewritten_callers():
    """Two ops sharing the outer frames (memoized once) both get the model's frames; the names JAX gave stay."""
    outer = (_frame("forward", MODEL_FILE, 30), _frame("loss_of", STEP_FILE, 365), _frame("<module>", RUN_FILE, 3))
    traces = [_trace(_frame("a", JAX_FILE, 1), _frame("inner", MODEL_FILE, 10), *outer),
              _trace(_frame("b", JAX_FILE, 2), *outer)]
    locations, text = _rewritten(traces)
    assert locations == [f"{MODEL_FILE}:10", f"{MODEL_FILE}:30"]
    assert 'loc("jit(step)/op0"' in text and 'loc("jit(step)/op1"' in text
    assert JAX_FILE not in text and RUN_FILE not in text and STEP_FILE not in text
