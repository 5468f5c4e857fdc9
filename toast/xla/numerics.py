"""Numerics of the check: seeded random inputs for ``@main``'s arguments, and each device's output shard against
the matching slice of the unsharded reference (NaN-aware, tolerance by element type). Runs in the check
worker (``numpy``, ``jax``); ``finite_scale`` and ``shard_agreement`` are pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toast.errors import ToastError

__all__ = ["compare_outputs", "finite_scale", "numpy_dtype", "random_inputs", "shard_agreement"]


# Comparison tolerances (rtol, atol) by element type; exact for integers and booleans.
_TOLERANCES: dict[str, tuple[float, float]] = {
    "f64": (1e-4, 1e-5),
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 1e-2),
    "bf16": (1e-2, 1e-2),
}


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


def random_inputs(arguments: Sequence[tuple[tuple[int, ...], str]], *, seed: int) -> list[Any]:
    """Seeded inputs: floats ``0.1 * |N(0, 1)|`` (non-negative, so that an optimizer state such as Adam's
    second moment stays non-negative and its square root finite); integers uniform in ``[0, k)`` where
    ``k`` is the smallest dimension (>1) of any argument, so that they index any of them; booleans
    uniform."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dims = [d for shape, _ in arguments for d in shape if d > 1]
    high = min(dims) if dims else 2
    inputs = []
    for shape, element_type in arguments:
        dtype = numpy_dtype(element_type)
        if dtype == np.bool_:
            value = rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            value = rng.integers(0, high, size=shape).astype(dtype)
        elif np.issubdtype(dtype, np.complexfloating):
            value = (0.1 * (rng.standard_normal(shape) + 1j * rng.standard_normal(shape))).astype(dtype)
        else:
            value = (0.1 * np.abs(rng.standard_normal(shape))).astype(dtype)
        inputs.append(value)
    return inputs


def compare_outputs(outputs: Sequence[Sequence[Any]], expected: Sequence[Any], shardings: Sequence[Any] | None,
             devices: Sequence[Any]) -> dict[str, Any]:
    """Each device's output shard against the reference slice it should hold.

    Args:
      outputs: per output, the per-device result arrays (``jax.Array`` on one device each).
      expected: per output, the full reference value.
      shardings: per output, its ``OpSharding`` over ``devices`` (partition order); None for a 1-device
        executable (XLA gives none: each output is whole).
      devices: the devices of the sharded run.

    Returns:
      ``{"match", "max_abs_error", "outputs", "nan_values", "nan_mismatches"}`` as in ``Numerics``.
    """
    import numpy as np
    from jax.extend.sharding import GSPMDSharding

    if len(outputs) != len(expected) or (shardings is not None and len(shardings) != len(expected)):
        raise ToastError(f"the sharded module returns {len(outputs)} outputs, the reference {len(expected)}")
    match, worst, nan_values, nan_mismatches = True, 0.0, 0, 0
    for index, (output, reference) in enumerate(zip(outputs, expected, strict=True)):
        reference = np.asarray(reference)
        where = ({device: () for device in devices} if shardings is None
                 else GSPMDSharding(tuple(devices), shardings[index]).devices_indices_map(reference.shape))
        tolerance = _TOLERANCES.get(_short_dtype(reference.dtype))
        scale = finite_scale(reference)
        if np.issubdtype(reference.dtype, np.inexact):
            nan_values += int(np.isnan(reference).sum())
        for shard in output:
            got = np.asarray(shard)
            want = reference[where[next(iter(shard.devices()))]]
            if got.shape != want.shape:
                raise ToastError(f"output shard of shape {got.shape} where the reference slice is {want.shape}")
            if got.size == 0:
                continue
            close, error, mismatched = shard_agreement(got, want, tolerance=tolerance, scale=scale)
            match &= close
            worst = max(worst, error)
            nan_mismatches += mismatched
    return {"match": match, "max_abs_error": worst, "outputs": len(expected), "nan_values": nan_values,
            "nan_mismatches": nan_mismatches}


def finite_scale(reference: Any) -> float:
    """The largest magnitude among the finite values of ``reference`` (0 where there are none): what the
    absolute tolerance scales with (sharding reorders sums, whose rounding error follows the output's
    magnitude, not each element's); one NaN or infinity must not make every tolerance NaN or infinite."""
    import numpy as np

    values = np.abs(np.asarray(reference).astype(np.complex128))
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else 0.0


def shard_agreement(got: Any, want: Any, *, tolerance: tuple[float, float] | None, scale: float
                    ) -> tuple[bool, float, int]:
    """One output shard against its reference slice: ``(close, largest absolute difference where both are
    finite, elements NaN on one side only)``. Close: no NaN on one side only, and the rest within
    ``tolerance`` (rtol, atol), the absolute part plus rtol·``scale``, or equal where ``tolerance`` is
    ``None`` (integers, booleans); NaN matches NaN, an infinity the same infinity."""
    import numpy as np

    got_c, want_c = np.asarray(got).astype(np.complex128), np.asarray(want).astype(np.complex128)
    mismatched = int((np.isnan(got_c) != np.isnan(want_c)).sum())
    both = np.isfinite(got_c) & np.isfinite(want_c)
    error = float(np.max(np.abs(got_c[both] - want_c[both]))) if both.any() else 0.0
    if tolerance is None:
        close = bool(np.array_equal(got_c, want_c, equal_nan=True))
    else:
        rtol, atol = tolerance
        close = bool(np.allclose(got_c, want_c, rtol=rtol, atol=atol + rtol * scale, equal_nan=True))
    return mismatched == 0 and close, error, mismatched


def _short_dtype(dtype: Any) -> str:
    """``f32``-style name of a numpy float dtype, else its numpy name."""
    return {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(str(dtype), str(dtype))
