"""The StableHLO reader: names, locations, inlining, regions, and bad input."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from toast import InputError, read_callable, read_file, read_text
from toast.examples.mlp import mlp
from toast.frontend import lower_callable


def test_mlp_names_locations_and_inlined_relu():
    fn, args = mlp()
    program = read_callable(fn, args)
    names = [program.values[v].name for v in program.arguments]
    assert names == ["x", "w1", "w2"]
    assert [program.values[v].name for v in program.results] == ["result"]
    kinds = [op.kind for op in program.ops]
    # relu is a private function: inlined as region 0 of its func.call.
    assert kinds.count("stablehlo.dot_general") == 2
    assert "stablehlo.maximum" in kinds
    call = next(op for op in program.ops if op.kind == "func.call")
    maximum = next(op for op in program.ops if op.kind == "stablehlo.maximum")
    assert maximum.parent == (call.id, 0)
    dot = next(op for op in program.ops if op.kind == "stablehlo.dot_general")
    assert dot.loc.endswith("toast/examples/mlp.py:" + str(_line_of("toast/examples/mlp.py", "y = x @ w1")))
    # Ops inside relu carry no user frame of their own: they take the call site's line.
    assert maximum.loc.endswith("toast/examples/mlp.py:" + str(_line_of("toast/examples/mlp.py", "z = jax.nn.relu(y)")))


def _line_of(path: str, text: str) -> int:
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(text)


def test_two_calls_of_one_function_get_separate_values():
    def f(x):
        return jax.nn.relu(x) + jax.nn.relu(x * 2)

    program = read_callable(f, [jax.ShapeDtypeStruct((4, 3), jnp.float32)])
    maxima = [op for op in program.ops if op.kind == "stablehlo.maximum"]
    assert len(maxima) == 2
    assert maxima[0].results != maxima[1].results
    names = {program.values[m.results[0]].name for m in maxima}
    assert names == {"@relu#0:%1", "@relu#1:%1"}


def test_while_regions_block_args_and_results():
    def f(x):
        def body(carry, _):
            return carry * 2.0, carry.sum()
        return jax.lax.scan(body, x, None, length=3)

    program = read_callable(f, [jax.ShapeDtypeStruct((4, 5), jnp.float32)])
    loop = next(op for op in program.ops if op.kind == "stablehlo.while")
    assert len(loop.regions) == 2
    assert len(loop.regions[0]) == len(loop.operands) == len(loop.results)
    assert program.values[loop.regions[1][1]].shape == (4, 5)
    terminators = [op for op in program.ops if op.parent == (loop.id, 1) and op.kind == "stablehlo.return"]
    assert len(terminators) == 1


def test_multi_result_names_and_pytree_arguments():
    def f(params, x):
        h = x @ params["w"]
        return {"out": h, "sum": h.sum()}

    args = ({"w": jax.ShapeDtypeStruct((4, 8), jnp.float32)}, jax.ShapeDtypeStruct((3, 4), jnp.float32))
    program = read_callable(f, args)
    assert [program.values[v].name for v in program.arguments] == ["params['w']", "x"]
    assert sorted(program.values[v].name for v in program.results) == ["result['out']", "result['sum']"]


def test_large_dense_constant_is_not_decoded(tmp_path):
    import numpy as np

    table = np.arange(100_000, dtype=np.float32)

    def f(x):
        return x + table

    text = lower_callable(f, [jax.ShapeDtypeStruct((100_000,), jnp.float32)])
    program = read_text(text)
    constant = next(op for op in program.ops if op.kind == "stablehlo.constant")
    assert constant.attrs == ()
    assert program.values[constant.results[0]].shape == (100_000,)


def test_mlir_file_round_trip(tmp_path):
    fn, args = mlp()
    path = tmp_path / "mlp.mlir"
    path.write_text(lower_callable(fn, args))
    program = read_file(path)
    assert [program.values[v].name for v in program.arguments] == ["x", "w1", "w2"]


MALFORMED = """func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %b : tensor<2xf32>
  return %0 : tensor<2xf32>
}
"""

DYNAMIC = """func.func @main(%a: tensor<?x4xf32>) -> tensor<?x4xf32> {
  %0 = stablehlo.add %a, %a : tensor<?x4xf32>
  return %0 : tensor<?x4xf32>
}
"""


def test_malformed_mlir_reports_line_and_column(tmp_path):
    path = tmp_path / "bad.mlir"
    path.write_text(MALFORMED)
    with pytest.raises(InputError, match=r"bad\.mlir:2:26: use of undeclared SSA value name"):
        read_file(path)


def test_dynamic_shape_is_rejected_with_a_hint(tmp_path):
    path = tmp_path / "dyn.mlir"
    path.write_text(DYNAMIC)
    with pytest.raises(InputError, match=r"dynamic shape tensor<\?x4xf32>.*static shapes"):
        read_file(path)


def test_missing_file():
    with pytest.raises(InputError, match="cannot read"):
        read_file("/nonexistent/x.mlir")
