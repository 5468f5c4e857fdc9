"""The kernel microbenchmarks behind a profile's ``[kernels]`` numbers, and the numbers derived from them.

``measure_kernels`` times, with JAX and XLA as toast's programs run, on the local accelerator:

- matmuls (``jnp.dot``/``einsum``) of several shapes in bf16, and in f32 at XLA's default precision and at
  ``HIGHEST`` (the rate XLA really gives f32 matmuls);
- elementwise kernels over large and small arrays (achieved HBM bandwidth, bytes read + written);
- a row reduction (softmax) over large arrays;
- a chain of tiny dependent kernels (the fixed cost of one kernel: launch and tail);
- gathers and scatter-adds of rows (``x[ids]``, ``segment_sum``) with random indices.

``kernel_numbers`` derives from such a document the ``[kernels]`` numbers that are measured, not fitted:
the step overhead (the fastest one-kernel program), the per-kernel overhead (the slope of the chains), the
matmul and HBM efficiencies (the largest bf16 matmul and f32 elementwise kernel, less those overheads) and the
scatter-add rates. ``matmul_overhead`` is fitted to whole programs (``benchmarks/calibrate_cost.py``) and
``f32_matmul`` is a choice: both stay as the base profile has them. ``toast calibrate --kernels`` runs both.
"""

from __future__ import annotations

import datetime
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from toast.cost.hardware import Hardware
from toast.errors import ToastError


def median_seconds(fn, args, *, warmups: int = 3, runs: int = 20) -> float:
    """The median wall seconds of ``fn(*args)`` over ``runs`` timed calls, after ``warmups`` untimed ones (compiling
    and warming caches), each waited for with ``jax.block_until_ready``."""
    for _ in range(warmups):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _kernels(compiled_text: str) -> int:
    """Instructions of the entry computation that launch work (fusions, library calls, copies, loops)."""
    lines = compiled_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ENTRY"))
    count = 0
    for line in lines[start + 1:]:
        if line.startswith("}"):
            break
        body = line.split("=", 1)[-1]
        if any(f" {k}(" in body for k in ("fusion", "custom-call", "copy", "while", "scatter", "gather",
                                           "reduce", "sort", "all-reduce", "convolution", "dot")):
            count += 1
    return count


class _Cases:
    """The microbenchmark cases run so far: each is compiled, timed and appended as a row."""

    def __init__(self, *, quick: bool, progress: Callable[[str], None]) -> None:
        self.key = jax.random.PRNGKey(0)
        self.rows: list[dict] = []
        self.quick = quick
        self.scale = 8 if quick else 1
        self.progress = progress

    def case(self, name: str, fn, args, *, flops: float = 0.0, bytes_moved: float = 0.0, **extra) -> None:
        jitted = jax.jit(fn)
        compiled = jitted.lower(*args).compile()
        seconds = median_seconds(jitted, args, runs=5 if self.quick else 20)
        row = {"name": name, "seconds": seconds, "flops": flops, "bytes": bytes_moved,
               "kernels": _kernels(compiled.as_text() or ""), **extra}
        self.rows.append(row)
        rate = f"{flops / seconds / 1e12:8.1f} TFLOP/s" if flops else f"{bytes_moved / seconds / 1e9:8.1f} GB/s"
        self.progress(f"{name:48s} {seconds * 1e3:9.4f} ms {rate} kernels={row['kernels']}")

    def rand(self, shape, dtype, k=1):
        return jax.random.normal(jax.random.fold_in(self.key, k), shape, dtype=jnp.float32).astype(dtype)


def measure_kernels(*, quick: bool = False, progress: Callable[[str], None] = print) -> dict:
    """Time the microbenchmarks on the local accelerator and return the document ``benchmarks/data/*_microbench.json``
    holds: the device, jax version, date, and one row per case (``seconds``, ``flops``, ``bytes``, ``kernels`` and
    what the case is). ``quick`` shrinks every size 8x (a smoke run). Each case: 3 warm-up runs, then the median of
    20 timed runs (``block_until_ready``), fresh random inputs."""
    cases = _Cases(quick=quick, progress=progress)
    for measure in (_matmul_cases, _memory_cases, _launch_cases, _indexing_cases):
        measure(cases)
    device = jax.devices()[0]
    return {
        "device": getattr(device, "device_kind", str(device)),
        "platform": device.platform,
        "jax": jax.__version__,
        "date": datetime.date.today().isoformat(),
        "how": "median of 20 timed runs after 3 warm-ups, block_until_ready, host clock; random inputs",
        "numpy": np.__version__,
        "cases": cases.rows,
    }


def _matmul_cases(cases: _Cases) -> None:
    """Matmuls: (M, K, N) and batched attention-shaped products, in bf16 and f32 at two precisions."""
    shapes = [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 768, 2304), (8192, 768, 3072), (8192, 3072, 768),
              (8192, 768, 768), (2048, 768, 3072), (1024, 1024, 1024), (512, 512, 512), (256, 256, 256),
              (128, 128, 128), (8192, 768, 50304), (2048, 2048, 8192)]
    scale = cases.scale
    for dtype, precision, label in ((jnp.bfloat16, None, "bf16"), (jnp.float32, None, "f32_default"),
                                    (jnp.float32, jax.lax.Precision.HIGHEST, "f32_highest")):
        for m, k, n in shapes:
            m, k, n = max(m // scale, 8), max(k // scale, 8), max(n // scale, 8)
            a, b = cases.rand((m, k), dtype, 1), cases.rand((k, n), dtype, 2)
            size = jnp.dtype(dtype).itemsize
            cases.case(f"matmul_{label}_{m}x{k}x{n}", lambda x, y, p=precision: jnp.dot(x, y, precision=p), (a, b),
                       flops=2.0 * m * k * n, bytes_moved=float(size * (m * k + k * n + m * n)),
                       kind="matmul", dtype=label, shape=[m, k, n])
        for bh, s, d in ((96, 1024, 64), (128, 512, 128), (384, 128, 64)):
            bh = max(bh // scale, 2)
            q, kk = cases.rand((bh, s, d), dtype, 3), cases.rand((bh, s, d), dtype, 4)
            size = jnp.dtype(dtype).itemsize
            cases.case(f"bmm_{label}_{bh}x{s}x{d}x{s}",
                       lambda x, y, p=precision: jnp.einsum("bqd,bkd->bqk", x, y, precision=p), (q, kk),
                       flops=2.0 * bh * s * s * d, bytes_moved=float(size * (2 * bh * s * d + bh * s * s)),
                       kind="matmul", dtype=label, shape=[bh, s, d, s])


def _memory_cases(cases: _Cases) -> None:
    """Elementwise kernels (y = x * 1.5 + 0.5: one read, one write; sizes from L2-resident to HBM-sized) and
    softmax over rows of attention scores (a reduction kernel and its elementwise neighbours)."""
    shrink = 3 if cases.quick else 0
    for dtype, label in ((jnp.bfloat16, "bf16"), (jnp.float32, "f32")):
        for exponent in (16, 20, 22, 24, 26, 28):
            n = 2 ** max(exponent - shrink, 10)
            x = cases.rand((n,), dtype, 5)
            size = jnp.dtype(dtype).itemsize
            cases.case(f"elementwise_{label}_2^{exponent}", lambda v: v * 1.5 + 0.5, (x,),
                       bytes_moved=2.0 * n * size, kind="elementwise", dtype=label, elements=n)
        for exponent in (20, 24, 26):
            n = 2 ** max(exponent - shrink, 10)
            x, y = cases.rand((n,), dtype, 6), cases.rand((n,), dtype, 7)
            size = jnp.dtype(dtype).itemsize
            cases.case(f"elementwise3_{label}_2^{exponent}", lambda u, v: jnp.tanh(u) * v + u, (x, y),
                       bytes_moved=3.0 * n * size, kind="elementwise", dtype=label, elements=n)
    for b, h, s in ((8, 12, 1024), (2, 12, 1024), (32, 12, 128)):
        b = max(b // cases.scale, 1)
        x = cases.rand((b, h, s, s), jnp.bfloat16, 8)
        cases.case(f"softmax_bf16_{b}x{h}x{s}x{s}", lambda v: jax.nn.softmax(v, axis=-1), (x,),
                   bytes_moved=2.0 * b * h * s * s * 2, kind="softmax", dtype="bf16", elements=b * h * s * s)


def _launch_cases(cases: _Cases) -> None:
    """Fixed cost per kernel: a chain of dependent tiny matmuls and elementwise ops, none fusable with the next."""
    for chain in (100, 400):
        w = cases.rand((64, 64), jnp.float32, 9)
        x = cases.rand((64, 64), jnp.float32, 10)

        def tiny(v, m, steps=chain):
            for _ in range(steps):
                v = jnp.tanh(v @ m)
            return v

        cases.case(f"tiny_chain_{chain}", tiny, (x, w), kind="launch", steps=chain)


def _indexing_cases(cases: _Cases) -> None:
    """Gather and scatter-add of rows with uniformly random indices (the GNN's message passing), and the
    scatter-add with sorted indices."""
    nodes, edges = (100_000, 1_000_000) if not cases.quick else (10_000, 100_000)
    for dtype, label in ((jnp.bfloat16, "bf16"), (jnp.float32, "f32")):
        for features in (128, 256):
            size = jnp.dtype(dtype).itemsize
            table = cases.rand((nodes, features), dtype, 11)
            ids = jax.random.randint(jax.random.fold_in(cases.key, 12), (edges,), 0, nodes)
            cases.case(f"gather_{label}_{edges}x{features}", lambda t, i: t[i], (table, ids),
                       bytes_moved=float(2 * edges * features * size + 4 * edges), kind="gather", dtype=label,
                       rows=edges, features=features)
            data = cases.rand((edges, features), dtype, 13)
            moved = float(edges * features * size + 4 * edges + nodes * features * size)
            cases.case(f"scatter_add_{label}_{edges}x{features}",
                       lambda d, i: jax.ops.segment_sum(d, i, num_segments=nodes), (data, ids),
                       bytes_moved=moved, kind="scatter_add", dtype=label, rows=edges, features=features)
            sorted_ids = jnp.sort(ids)
            cases.case(f"scatter_add_sorted_{label}_{edges}x{features}",
                       lambda d, i: jax.ops.segment_sum(d, i, num_segments=nodes, indices_are_sorted=True),
                       (data, sorted_ids), bytes_moved=moved, kind="scatter_add_sorted", dtype=label, rows=edges,
                       features=features)


MAX_DOCUMENT_BYTES = 16 << 20
"""The largest microbenchmark document read, bytes (``measure_kernels``' is about 20 KB)."""
MAX_CASES = 10_000
"""The most cases a microbenchmark document may hold (``measure_kernels`` runs about 80)."""
OVER_PEAK = 1.2
"""How far over a profile's peak a measured rate may be (a clock above the datasheet's) before the document is
refused as another device's or wrong; a rate up to it counts as the peak."""
# The fields of a case that are numbers: (whole numbers only, required, lowest, highest). Times as
# ``toast.cost.calibration`` believes them; counts of FLOPs and bytes no device does in 10^4 s past the highest.
_CASE_NUMBERS: dict[str, tuple[bool, bool, float, float]] = {
    "seconds": (False, True, 1e-9, 1e4), "flops": (False, True, 0.0, 1e24), "bytes": (False, True, 0.0, 1e24),
    "kernels": (True, True, 0, 10_000_000), "rows": (True, False, 1, 1 << 48), "features": (True, False, 1, 1 << 48)}
_CASE_TEXTS = ("name", "kind", "dtype")
_DOCUMENT_TEXTS = ("device", "platform", "date")


def read_microbench(path: str | Path) -> dict:
    """The microbenchmark document (``measure_kernels``' JSON) saved in ``path``, read within
    ``MAX_DOCUMENT_BYTES`` whatever the file is; ``kernel_numbers`` checks what it holds.

    Raises:
      ToastError: it cannot be read, is too large, or is not UTF-8 JSON (``file:line:column``).
    """
    from toast.cost.calibration import read_bounded, shown

    data = read_bounded(path, what="microbenchmark document", max_bytes=MAX_DOCUMENT_BYTES)
    where = shown(path)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ToastError(f"{where}: not UTF-8 text: not a microbenchmark document") from None
    except json.JSONDecodeError as error:
        raise ToastError(f"{where}:{error.lineno}:{error.colno}: not JSON: {error.msg}") from None
    except (ValueError, RecursionError) as error:  # a number of thousands of digits; nesting past the stack
        raise ToastError(f"{where}: not a microbenchmark document ({error.__class__.__name__})") from None


def _checked_cases(document: object) -> list[dict]:
    """The cases of a microbenchmark document, each field a string or a number in its range.

    Raises:
      ToastError: not a JSON object with a list of cases, or a case's field of the wrong type or range.
    """
    if not isinstance(document, dict) or not isinstance(document.get("cases"), list):
        raise ToastError("not a microbenchmark document: a JSON object with a list 'cases'")
    for field in _DOCUMENT_TEXTS:
        if field in document and not (isinstance(document[field], str) and len(document[field]) <= 200
                                      and document[field].isprintable()):
            raise ToastError(f"'{field}' must be a line of text, not {_shown_value(document[field])}")
    cases = document["cases"]
    if len(cases) > MAX_CASES:
        raise ToastError(f"{len(cases)} cases: a microbenchmark document holds at most {MAX_CASES}")
    for index, case in enumerate(cases):
        if not isinstance(case, dict):
            raise ToastError(f"cases[{index}] must be a JSON object, not {_shown_value(case)}")
        for field in _CASE_TEXTS:
            if (field in case or field == "name") and not (isinstance(case.get(field), str)
                                                           and len(case[field]) <= 200):
                raise ToastError(f"cases[{index}].{field} must be a string, not {_shown_value(case.get(field))}")
        for field, (whole, required, lowest, highest) in _CASE_NUMBERS.items():
            if field not in case and not required:
                continue
            value = case.get(field)
            kind = int if whole else (int, float)
            # bool is an int in Python, and true is no count of anything.
            if isinstance(value, bool) or not isinstance(value, kind) or not lowest <= value <= highest:
                raise ToastError(f"cases[{index}] ({ascii(case['name'][:60])}): {field} must be a "
                                 f"{'whole ' if whole else ''}number from {lowest:g} to {highest:g}, not "
                                 f"{_shown_value(value)}")
    return cases


def _shown_value(value: object) -> str:
    """A JSON value as a message shows it: its repr cut to 40 characters."""
    text = ascii(value)
    return text if len(text) <= 40 else text[:37] + "..."


def kernel_numbers(document: dict, hardware: Hardware) -> dict[str, float]:
    """The measured ``[kernels]`` numbers of a ``measure_kernels`` document, against ``hardware``'s peaks.

    Raises:
      ToastError: a field of the wrong type or out of range (``_checked_cases``); a case the derivation needs
        is missing; a time leaves nothing after the overheads; a rate more than ``OVER_PEAK`` times the
        profile's peak.
    """
    cases_list = _checked_cases(document)
    try:
        cases = {case["name"]: case for case in cases_list}
        step = min(float(case["seconds"]) for case in cases_list
                   if case.get("kind") == "elementwise" and case["kernels"] == 1)
        chains = sorted((case for case in cases_list if case.get("kind") == "launch"),
                        key=lambda case: case["kernels"])
        short, long = chains[0], chains[-1]
        matmul = max((case for case in cases_list if case["name"].startswith("matmul_bf16_")),
                     key=lambda case: case["flops"])
        streaming = max((case for case in cases_list if case["name"].startswith("elementwise_f32_2^")),
                        key=lambda case: case["bytes"])
        scatters = {bits: cases[name] for bits, name in ((32, "scatter_add_f32_1000000x256"),
                                                         (16, "scatter_add_bf16_1000000x256"))}
    except (KeyError, ValueError, IndexError) as error:
        raise ToastError(f"the microbenchmark document lacks a case the [kernels] numbers need ({error})") from None
    for case in scatters.values():
        if "rows" not in case or "features" not in case:
            raise ToastError(f"microbenchmark {ascii(case['name'])} needs its 'rows' and 'features'")
    if long["kernels"] <= short["kernels"]:
        raise ToastError("the chains of tiny kernels (kind 'launch') need two different kernel counts")
    kernel = (long["seconds"] - short["seconds"]) / (long["kernels"] - short["kernels"])
    if kernel <= 0:
        raise ToastError("the chains of tiny kernels do not take longer with more kernels: no per-kernel overhead")

    def busy(case: dict) -> float:
        seconds = float(case["seconds"]) - step - kernel
        if seconds <= 0:
            raise ToastError(f"microbenchmark {ascii(case['name'])}: {case['seconds']:.3g} s is no more than the "
                             f"step and kernel overheads")
        return seconds

    def efficiency(case: dict, amount: float, what: str, peak: float) -> float:
        """``amount`` per busy second as a fraction of ``peak``."""
        fraction = amount / busy(case) / peak
        if not 0 < fraction <= OVER_PEAK:
            raise ToastError(f"microbenchmark {ascii(case['name'])}: {amount:.3g} {what} in {case['seconds']:.3g} s "
                             f"is {fraction:.3g} of profile '{hardware.name}''s peak ({peak:.3g} {what}/s): another "
                             f"device's measurements, or wrong numbers")
        return min(1.0, fraction)

    found = {
        "step_overhead": step,
        "kernel_overhead": kernel,
        "matmul_efficiency": efficiency(matmul, matmul["flops"], "FLOPs", hardware.flops("bf16")),
        "hbm_efficiency": efficiency(streaming, streaming["bytes"], "bytes", hardware.hbm_bandwidth),
    }
    for bits, case in scatters.items():
        key = "scatter_add_rate" if bits == 32 else "scatter_add_rate_16bit"
        # An update reads and writes at least its element: no faster than memory moves elements.
        efficiency(case, case["rows"] * case["features"] * bits / 8, "bytes", hardware.hbm_bandwidth)
        found[key] = case["rows"] * case["features"] / busy(case)
    return found
