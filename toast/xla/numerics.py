"""Numerics of the check: seeded random inputs for ``@main``'s arguments, and each device's output shard against
the matching slice of the unsharded reference (NaN-aware, tolerance by element type, relative to each output's
scale). Runs in the check worker (``numpy``, ``jax``, MLIR bindings); ``finite_scale``, ``shard_agreement``,
``random_input`` and ``worst_outputs`` are pure.

Inputs are scaled like an initializer, so that a program's values stay in their usual range: a float tensor of
rank >= 2 is ``N(0, 1/fan_in)`` with ``fan_in`` the product of all dims but the last (a weight ``[in, out]``
gets ``1/sqrt(in)``), a vector ``N(0, 0.1^2)``, a scalar uniform in ``[0.5, 1.5)`` (a step size, count or
divisor: positive, order one). Inputs that reach a square root, a logarithm or a power through elementwise ops
and data movement alone (an optimizer's second moment), or a divisor through these and sums, take the absolute
value, so that they stay finite and the quotients well-conditioned (``non_negative_arguments``). Integers are
uniform in ``[0, k)``, ``k`` the smallest dimension (> 1) of any argument, so that they index any of them;
booleans uniform. Each argument comes from its own generator
(``seed``, argument index), so the worker makes it again for the second run instead of keeping a copy.

Why not all-positive inputs (``0.1 * |N(0, 1)|``, as before): with every weight positive, stacked matmuls
grow each layer, a loss reached 2.4e7 and Adam's second moments 8.4e7, and float32 reduction order alone
(even ``jax.jit`` with only inputs and outputs pinned) then differed by a relative 6e-4: a correct sharding
failed the check.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from toast.errors import ToastError
from toast.xla.report import OutputError

__all__ = ["compare_output", "compare_outputs", "finite_scale", "index_bound", "non_negative_arguments",
           "numpy_dtype", "random_input", "random_inputs", "shard_agreement", "worst_outputs"]


# Comparison tolerances (rtol, atol) by element type; exact for integers and booleans.
_TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-4, 1e-5),
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 1e-2),
    "bf16": (1e-2, 1e-2),
}

VECTOR_STD = 0.1
SCALAR_RANGE = (0.5, 1.5)
WORST_OUTPUTS = 3  # outputs named in the report


def numpy_dtype(element_type: str) -> Any:
    """The numpy dtype of an MLIR element type name (``f32``, ``i32``, ``ui8``, ``i1``, ``bf16``)."""
    import ml_dtypes
    import numpy as np

    table = {"f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
             "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
             "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64,
             "complex<f32>": np.complex64, "complex<f64>": np.complex128}
    if element_type not in table:
        raise ToastError(f"@main has an argument of element type {element_type}, which the XLA check cannot fill")
    return np.dtype(table[element_type])


# ---- inputs ---------------------------------------------------------------------------------------------


def index_bound(arguments: Sequence[tuple[tuple[int, ...], str]]) -> int:
    """``k`` of the integer inputs ``[0, k)``: the smallest dimension (> 1) of any argument (2 when none)."""
    dims = [d for shape, _ in arguments for d in shape if d > 1]
    return min(dims) if dims else 2


def float_std(shape: tuple[int, ...]) -> float:
    """The standard deviation of a float input of rank >= 1 (see the module docstring)."""
    if len(shape) == 1:
        return VECTOR_STD
    return 1.0 / math.sqrt(max(1, math.prod(shape[:-1])))


def random_input(shape: tuple[int, ...], element_type: str, *, seed: int, index: int, high: int,
                 non_negative: bool = False) -> Any:
    """Argument ``index``'s input (a numpy array), the same for the same ``(seed, index)``.

    Args:
      shape, element_type: the argument's type (MLIR element type name).
      seed: the check's seed.
      index: the argument's position in ``@main``.
      high: integers are uniform in ``[0, high)`` (``index_bound``).
      non_negative: floats take their absolute value (scalars are positive anyway).
    """
    import numpy as np

    dtype = numpy_dtype(element_type)
    rng = np.random.default_rng((seed, index))
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, high, size=shape).astype(dtype)
    if not shape:
        return np.asarray(rng.uniform(*SCALAR_RANGE), dtype=dtype)
    std = float_std(shape)
    real = np.float64 if dtype in (np.float64, np.complex128) else np.float32
    if np.issubdtype(dtype, np.complexfloating):
        value = rng.standard_normal(shape, dtype=real) + 1j * rng.standard_normal(shape, dtype=real)
    else:
        value = rng.standard_normal(shape, dtype=real)
    value *= std
    if non_negative:
        value = np.abs(value) if not np.iscomplexobj(value) else value
    return value.astype(dtype, copy=False)


def random_inputs(arguments: Sequence[tuple[tuple[int, ...], str]], *, seed: int,
                  non_negative: frozenset[int] = frozenset()) -> list[Any]:
    """Every argument's ``random_input`` (a convenience; the worker makes them one at a time)."""
    high = index_bound(arguments)
    return [random_input(shape, element_type, seed=seed, index=index, high=high, non_negative=index in non_negative)
            for index, (shape, element_type) in enumerate(arguments)]


# Ops whose results carry their operands' values (elementwise arithmetic, data movement), by the operands that
# do (None: all of them). A sign reaches a root through these.
_CARRIERS: dict[str, tuple[int, ...] | None] = {
    **{f"stablehlo.{name}": None for name in (
        "add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "convert", "broadcast_in_dim",
        "reshape", "transpose", "slice", "concatenate", "pad", "reverse", "copy", "optimization_barrier")},
    "stablehlo.select": (1, 2), "stablehlo.clamp": (1,), "stablehlo.dynamic_slice": (0,),
    "stablehlo.dynamic_update_slice": (0, 1), "stablehlo.gather": (0,),
}
# Ops whose results sum their operands' products: a divisor's sign (and its distance from zero) comes through
# these as well. ``reduce``: its inputs, the first half of its operands (the rest are initial values).
_SUMS: dict[str, tuple[int, ...] | None] = {
    "stablehlo.dot_general": None, "stablehlo.dot": None, "stablehlo.convolution": None,
    "stablehlo.reduce": (), "stablehlo.reduce_window": (),
}
_FLOATS = frozenset({"f64", "f32", "f16", "bf16"})
# Ops that need a non-negative operand (by position) to give a finite, real result.
_ROOTS: dict[str, tuple[int, ...]] = {
    "stablehlo.sqrt": (0,), "stablehlo.rsqrt": (0,), "stablehlo.log": (0,), "stablehlo.log_plus_one": (0,),
    "stablehlo.power": (0,),
}
# Ops whose operand (by position) is divided by: a sum of zero-mean terms comes near zero.
_DIVISORS: dict[str, tuple[int, ...]] = {"stablehlo.divide": (1,), "stablehlo.remainder": (1,)}


def non_negative_arguments(module: Any) -> frozenset[int]:
    """Positions of ``@main``'s float arguments whose values reach

    - a square root, logarithm or power through elementwise ops, data movement, calls and loops alone (an
      optimizer's second moment ``v`` in ``m / sqrt(0.999 v + 0.001 g^2)``), not through a reduction or a
      matmul (a layer norm's input), or
    - a divisor through these and sums (matmuls, reductions) too, where no op that makes its result positive
      (``exp``, ``sqrt``, ``abs``, a square ``x * x``) comes between: ``a / sum(a)`` with ``a = k q^T`` (a
      softmax without its exponential), whose zero-mean terms would sum to near zero and make the quotient
      ill-conditioned.

    Args:
      module: the parsed MLIR module (``jaxlib.mlir.ir.Module``), inside its context.
    """
    from jaxlib.mlir import ir

    functions: dict[str, Any] = {}
    calls: dict[str, list[Any]] = {}
    for op in module.body:
        op = op.operation
        if op.name == "func.func":
            functions[ir.StringAttr(op.attributes["sym_name"]).value] = op
    for function in functions.values():
        for op in _operations(function):
            if op.name == "func.call":
                calls.setdefault(ir.FlatSymbolRefAttr(op.attributes["callee"]).value, []).append(op)
    if "main" not in functions:
        raise ToastError("the module has no entry function @main")

    def reached(start: Any, carriers: dict[str, tuple[int, ...] | None], roots: dict[str, tuple[int, ...]]) -> bool:
        """Whether ``start`` flows into a root's operand through ``carriers``."""
        seen, stack = {start}, [start]
        while stack:
            value = stack.pop()
            for use in value.uses:
                owner, position = use.owner.operation, use.operand_number
                name = owner.name
                if position in roots.get(name, ()):
                    return True
                following: list[Any] = []
                if name == "stablehlo.multiply" and owner.operands[0] == owner.operands[1]:
                    continue  # a square: non-negative whatever the sign of its operand
                if name in carriers:
                    carried = carriers[name]
                    if carried is None or position in carried or (carried == () and
                                                                  position < len(owner.operands) // 2):
                        following = list(owner.results)
                elif name == "func.call":
                    callee = functions.get(ir.FlatSymbolRefAttr(owner.attributes["callee"]).value)
                    if callee is not None:
                        following = [callee.regions[0].blocks[0].arguments[position]]
                elif name == "stablehlo.while":
                    following = [owner.results[position], *(region.blocks[0].arguments[position]
                                                             for region in owner.regions)]
                elif name in ("func.return", "stablehlo.return"):
                    following = _returned_to(owner.parent, position, calls)
                for item in following:
                    if item not in seen:
                        seen.add(item)
                        stack.append(item)
        return False

    main = functions["main"]
    found = set()
    summing = {**_CARRIERS, **_SUMS}
    for position, argument in enumerate(main.regions[0].blocks[0].arguments):
        if str(ir.RankedTensorType(argument.type).element_type) in _FLOATS and (
                reached(argument, _CARRIERS, _ROOTS) or reached(argument, summing, _DIVISORS)):
            found.add(position)
    return frozenset(found)


def _operations(operation: Any) -> list[Any]:
    """Every operation nested in ``operation``."""
    found = []
    for region in operation.regions:
        for block in region:
            for op in block:
                found.append(op.operation)
                found.extend(_operations(op.operation))
    return found


def _returned_to(parent: Any, position: int, calls: dict[str, list[Any]]) -> list[Any]:
    """Where a value returned at ``position`` by a region of ``parent`` goes on: the results of every call of a
    function; a loop's result and its body's and condition's next arguments; a branch op's result."""
    from jaxlib.mlir import ir

    parent = parent.operation
    if parent.name == "func.func":
        name = ir.StringAttr(parent.attributes["sym_name"]).value
        return [call.results[position] for call in calls.get(name, [])]
    if parent.name == "stablehlo.while":
        return [parent.results[position], *(region.blocks[0].arguments[position] for region in parent.regions)]
    if parent.name in ("stablehlo.case", "stablehlo.if") and position < len(parent.results):
        return [parent.results[position]]
    return []


# ---- comparison -----------------------------------------------------------------------------------------


def compare_output(name: str, shards: Sequence[Any], reference: Any, where: Callable[[Any], Any]) -> dict[str, Any]:
    """One output's shards against the reference.

    Args:
      name: the output's name (``result[1]['w']``).
      shards: the per-device result arrays (``jax.Array`` on one device each).
      reference: the full reference value (a ``jax.Array`` or numpy array).
      where: a shard's device -> the index of its slice of the reference.

    Returns:
      ``{"match", "max_abs_error", "scale", "nan_values", "nan_mismatches"}`` of this output.
    """
    import numpy as np

    want_all = np.asarray(reference)
    tolerance = _TOLERANCES.get(_short_dtype(want_all.dtype))
    scale = finite_scale(want_all)
    widened = _widened(want_all)  # bfloat16 is no numpy float: its NaN are counted in float32
    nan_values = int(np.isnan(widened).sum()) if np.issubdtype(widened.dtype, np.inexact) else 0
    del widened
    match, worst, nan_mismatches = True, 0.0, 0
    for shard in shards:
        got = np.asarray(shard)
        want = want_all[where(next(iter(shard.devices())))]
        if got.shape != want.shape:
            raise ToastError(f"{name}: output shard of shape {got.shape} where the reference slice is {want.shape}")
        if got.size == 0:
            continue
        close, error, mismatched = shard_agreement(got, want, tolerance=tolerance, scale=scale)
        match &= close
        worst = max(worst, error)
        nan_mismatches += mismatched
    return {"name": name, "match": match, "max_abs_error": worst, "scale": scale, "nan_values": nan_values,
            "nan_mismatches": nan_mismatches}


def compare_outputs(outputs: list[list[Any]], expected: list[Any], shardings: Sequence[Any] | None,
                    devices: Sequence[Any], *, names: Sequence[str] | None = None) -> dict[str, Any]:
    """Each device's output shard against the reference slice it should hold, output by output; each
    output's arrays are dropped from ``outputs`` and ``expected`` once compared (the lists are emptied), so
    that the check holds one output's copies at a time beyond what is left to compare.

    Args:
      outputs: per output, the per-device result arrays (``jax.Array`` on one device each).
      expected: per output, the full reference value.
      shardings: per output, its ``OpSharding`` over ``devices`` (partition order); None for a 1-device
        executable (XLA gives none: each output is whole).
      devices: the devices of the sharded run.
      names: per output, its name (``result[0]``); default ``result[i]``.

    Returns:
      ``{"match", "max_abs_error", "outputs", "nan_values", "nan_mismatches", "worst"}`` as in ``Numerics``.
    """
    from jax.extend.sharding import GSPMDSharding

    count = len(expected)
    if len(outputs) != count or (shardings is not None and len(shardings) != count):
        raise ToastError(f"the sharded module returns {len(outputs)} outputs, the reference {count}")
    names = list(names) if names is not None else [f"result[{i}]" for i in range(count)]
    checked = []
    for index in range(count):
        shards, reference = outputs[index], expected[index]
        outputs[index], expected[index] = [], None  # this output's last references: freed after the comparison
        if shardings is None:
            found = compare_output(names[index], shards, reference, lambda device: ())
        else:
            indices = GSPMDSharding(tuple(devices), shardings[index]).devices_indices_map(tuple(reference.shape))
            found = compare_output(names[index], shards, reference, indices.__getitem__)
        del shards, reference
        checked.append(found)
    return {"match": all(c["match"] for c in checked),
            "max_abs_error": max((c["max_abs_error"] for c in checked), default=0.0),
            "outputs": count, "nan_values": sum(c["nan_values"] for c in checked),
            "nan_mismatches": sum(c["nan_mismatches"] for c in checked),
            "worst": [_output_json(e) for e in worst_outputs(
                [OutputError(c["name"], c["match"], c["max_abs_error"], c["scale"], c["nan_mismatches"])
                 for c in checked])]}


def worst_outputs(errors: Sequence[OutputError], *, count: int = WORST_OUTPUTS) -> list[OutputError]:
    """The ``count`` worst outputs: mismatched ones first, then by relative error, then by name; outputs that
    agree exactly are left out."""
    ranked = sorted((e for e in errors if not e.match or e.max_abs_error > 0),
                    key=lambda e: (e.match, -e.relative_error, e.name))
    return ranked[:count]


def _output_json(error: OutputError) -> dict[str, Any]:
    return {"name": error.name, "match": error.match, "max_abs_error": error.max_abs_error, "scale": error.scale,
            "nan_mismatches": error.nan_mismatches}


def finite_scale(reference: Any) -> float:
    """The largest magnitude among the finite values of ``reference`` (0 where there are none): what the
    tolerance scales with (sharding reorders sums, whose rounding error follows the output's magnitude, not
    each element's); one NaN or infinity must not make every tolerance NaN or infinite."""
    import numpy as np

    values = np.abs(_widened(np.asarray(reference)))
    finite = values[np.isfinite(values)] if np.issubdtype(values.dtype, np.inexact) else values
    return float(finite.max()) if finite.size else 0.0


def shard_agreement(got: Any, want: Any, *, tolerance: tuple[float, float] | None, scale: float
                    ) -> tuple[bool, float, int]:
    """One output shard against its reference slice: ``(close, largest absolute difference where both are
    finite, elements NaN on one side only)``. Close: no NaN on one side only, and the rest within
    ``tolerance`` (rtol, atol): ``|got - want| <= atol + rtol * scale``, or equal where ``tolerance`` is
    ``None`` (integers, booleans); NaN matches NaN, an infinity the same infinity. Works in the element type
    widened to at least float32 (no complex copy of a real output)."""
    import numpy as np

    got_w, want_w = _widened(np.asarray(got)), _widened(np.asarray(want))
    if not np.issubdtype(want_w.dtype, np.inexact):
        equal = bool(np.array_equal(got_w, want_w))
        error = float(np.max(np.abs(got_w.astype(np.float64) - want_w))) if got_w.size and not equal else 0.0
        return equal, error, 0
    got_nan, want_nan = np.isnan(got_w), np.isnan(want_w)
    mismatched = int((got_nan != want_nan).sum())
    both = np.isfinite(got_w) & np.isfinite(want_w)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where not both finite: masked out
        difference = np.abs(got_w - want_w, where=both, out=np.zeros(got_w.shape, dtype=np.abs(want_w).dtype))
    error = float(difference.max()) if difference.size else 0.0
    if tolerance is None:
        close = bool(np.array_equal(got_w, want_w, equal_nan=True))
    else:
        rtol, atol = tolerance
        same_infinity = (got_w == want_w) | (got_nan & want_nan)  # an infinity (or NaN) matches only itself
        close = bool(np.all(np.where(both, difference <= atol + rtol * scale, same_infinity)))
    return mismatched == 0 and close, error, mismatched


def _widened(array: Any) -> Any:
    """``array`` in float32 where its element type is narrower (f16, bf16), else as it is."""
    import numpy as np

    if (array.dtype.kind == "f" and array.dtype.itemsize < 4) or str(array.dtype) == "bfloat16":
        return array.astype(np.float32)
    return array


def _short_dtype(dtype: Any) -> str:
    """``f32``-style name of a numpy float dtype, else its numpy name."""
    return {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(str(dtype), str(dtype))
