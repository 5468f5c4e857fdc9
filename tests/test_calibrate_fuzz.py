"""Fuzzing `toast calibrate` (issue 36): generated hostile nccl-tests logs (sizes, times, encodings, invalid
UTF-8, NUL bytes, huge lines, rank layouts, the collective named) and microbenchmark documents (JSON types,
ranges, nesting, broken bytes). Every case ends in one line `toast: error: ...` and exit 2 with nothing
written, or in a profile that loads, every fitted row the model misses by more than 2x reported as an
outlier; never a traceback, and within bounds of memory (an address-space limit) and time. A bounded deterministic
slice runs by default; ``-m slow`` runs about ten times as many."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import resource
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_calibrate import BASE  # the base profile the calibrate tests fit from

from toast.cli import main
from toast.cost.hardware import load_hardware

BINARIES = ("all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "alltoall_perf")
H100_DOCUMENT = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100_microbench.json"
MAX_EXTRA_BYTES = 256 << 20  # memory one case may map (the largest file read is 16 MiB)
MAX_CASE_SECONDS = 60.0  # a fit of a dozen rows takes about a second
MIN_FIT_BYTES = 1 << 16  # rows smaller than this are not fitted (fit_collectives' min_bytes)

# Hostile values, mixed with plausible ones so that part of the cases fit.
HOSTILE_SIZES = st.sampled_from(["0", "-1048576", "1" + "0" * 30, "1" + "0" * 400, "9" * 5000, "1e400", "4.5",
                                 str((1 << 48) + 1), "+65536", "1_000", "0x10", "nan"])
HOSTILE_TIMES = st.sampled_from(["1e-320", "0", "-3.5", "nan", "inf", "-inf", "1e30", "N/A", "1e-3", "0.00",
                                 "1" + "0" * 400, "5e-324"])
JUNK_LINES = st.sampled_from([
    b"", b"#", b"NCCL INFO Bootstrap : Using eth0", b"10-0-0-1:1234:1234 [0] NCCL INFO comm 0x1 rank 0",
    b"NCCL INFO \xff\xfe\xc3", b"abc\x00def", b"x" * 70_000, b"# " + b"9" * 70_000, "h\u00f4te \u65e5\u672c".encode(),
    b"\xef\xbb\xbf# BOM", b"#  Rank  0 Group  0 Pid 1 on h0 device 0",
    b"#  Rank 99999999999 Group 0 Pid 1 on h device 0", b"  1048576 262144 float sum -1", b"\r", b"all_gather_perf"])
# Files that are no regular files: endless, or never ending (a FIFO nobody writes to).
SPECIAL_FILES = ["/dev/zero", "/dev/urandom", "a FIFO with no writer", "/", "/nonexistent/all_reduce_perf.log"]
HOSTS = st.sampled_from(["h0", "h1", "node-2", "10.0.0.3", "h\u00e9", "x" * 300, "\x1bh"])


def rarely(draw, one_in: int) -> bool:
    """True about once in ``one_in`` draws (hypothesis draws small integers often, so the rare one is the
    largest)."""
    return draw(st.integers(0, one_in - 1)) == one_in - 1


@st.composite
def nccl_logs(draw) -> tuple[str, bytes]:
    """``(file name, contents)`` of an nccl-tests output, each part plausible or hostile (what hypothesis draws
    first, its simplest choices, is plausible: a run that fits)."""
    binary = draw(st.sampled_from([*BINARIES, "mystery_perf"] if rarely(draw, 10) else BINARIES))
    per_host = draw(st.lists(st.integers(0, 8).map(lambda n: 8 - n if n < 8 else 9), min_size=1, max_size=3))
    if not rarely(draw, 4):
        per_host = [per_host[0]] * len(per_host)  # an even layout most of the time
    hosts = draw(st.lists(HOSTS, min_size=len(per_host), max_size=len(per_host), unique=True))
    ranks = [host for host, count in zip(hosts, per_host, strict=True) for _ in range(count)]
    numbers = list(range(len(ranks)))
    if rarely(draw, 10):
        numbers[draw(st.integers(0, len(numbers) - 1))] = draw(st.integers(0, len(numbers) + 1))  # a duplicate or gap
    lines = [f"# mpirun -np {len(ranks)} ./build/{binary} -b 64K -e 1G -f 4 -g 1".encode(), b"# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {host} device {r % 8:2d} [0x00] GPU".encode()
              for r, host in zip(numbers, ranks, strict=True)]
    lines.append(b"#       size         count      type   redop    root     time   algbw   busbw #wrong")
    # A plausible cluster: latency + size / bandwidth, the same line for every row (so the model fits them).
    latency_us = draw(st.floats(1.0, 100.0))
    bandwidth = draw(st.floats(0.0, 4.9e10).map(lambda drop: 5e10 - drop))
    count = 6 - draw(st.integers(0, 6))
    for exponent in sorted(draw(st.lists(st.integers(0, 22).map(lambda n: 32 - n), min_size=count, max_size=count,
                                         unique=True))):
        size = 1 << exponent
        size_text = draw(HOSTILE_SIZES) if rarely(draw, 15) else str(size)
        us = latency_us + size / bandwidth * 1e6
        if rarely(draw, 8):
            us *= draw(st.sampled_from([1e-3, 0.02, 50.0, 1e4]))  # a wild row
        time_text = draw(HOSTILE_TIMES) if rarely(draw, 15) else f"{us:.2f}"
        lines.append(f"{size_text:>12} {size // 4:>13}     float     sum      -1 {time_text:>8}   1.00   1.00      0 "
                     f"{time_text:>8}   1.00   1.00      0".encode())
    if rarely(draw, 3):
        for _ in range(draw(st.integers(1, 3))):
            lines.insert(draw(st.integers(0, len(lines))), draw(JUNK_LINES))
    contents = b"\n".join(lines) + b"\n"
    if rarely(draw, 20):
        contents = contents.decode("utf-8", "replace").encode("utf-16")
    if rarely(draw, 20):
        contents = contents[:draw(st.integers(0, len(contents)))]
    name = draw(st.sampled_from([f"{binary}.log", "run.log", "nccl-\u00e9-\u65e5\u672c.log", 'a "q" \\ ]#.log']))
    return name, contents


JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(10 ** 30), 10 ** 30), st.sampled_from([1e308, -1.0, 0.0, 5e-324, 1e-12]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
CASE_FIELDS = st.sampled_from(["name", "seconds", "flops", "bytes", "kernels", "kind", "rows", "features", "dtype"])


@st.composite
def microbench_documents(draw) -> bytes:
    """The bytes of a microbenchmark document: the H100's run with hostile edits."""
    document = json.loads(H100_DOCUMENT.read_text())
    cases = document["cases"]
    for _ in range(draw(st.integers(0, 3))):
        edit = draw(st.integers(0, 5))
        index = draw(st.integers(0, len(cases) - 1))
        if edit <= 2:
            cases[index][draw(CASE_FIELDS)] = draw(JSON_VALUES)
        elif edit == 3:
            cases[index].pop(draw(CASE_FIELDS), None)
        elif edit == 4:
            del cases[index]
        else:
            document[draw(st.sampled_from(["device", "date", "cases"]))] = draw(JSON_VALUES)
    if draw(st.integers(0, 9)) == 0:
        document = draw(JSON_VALUES)  # not a document at all
    contents = json.dumps(document, allow_nan=True).encode()
    damage = draw(st.integers(0, 11))
    if damage == 0:
        contents = contents[:draw(st.integers(0, len(contents)))]
    elif damage == 1:
        at = draw(st.integers(0, len(contents)))
        contents = contents[:at] + draw(st.sampled_from([b"\xff", b"\x00", b"\xc3", b"[" * 50_000])) + contents[at:]
    elif damage == 2:
        contents = b"[" * 200_000 + b"]" * 200_000
    return contents


@contextlib.contextmanager
def address_space_limit(extra: int):
    """This process may map at most ``extra`` more bytes inside the block: past them an allocation fails
    (``MemoryError``), where a reader without limits grew until the machine ran out (tracemalloc would bound
    Python's allocations too, but makes a fit 4 times slower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    limit = mapped + extra if hard == resource.RLIM_INFINITY else min(mapped + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_calibrate(args: list[str]) -> tuple[int, str, str, float]:
    """``toast calibrate ARGS`` in this process, within ``MAX_EXTRA_BYTES`` more memory: (exit status, stdout,
    stderr, seconds)."""
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with address_space_limit(MAX_EXTRA_BYTES), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["calibrate", *args])
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


def assert_result_or_one_error(code: int, out: str, err: str, seconds: float, output: Path) -> None:
    assert seconds < MAX_CASE_SECONDS, seconds
    if code == 2:
        assert out == "" and err.startswith("toast: error: ") and err.count("\n") == 1, (out, err)
        assert not output.exists()
        return
    assert code == 0 and err == "", (code, err)
    load_hardware(str(output))
    output.unlink()


def assert_outliers_reported(out: str) -> None:
    """Every table row of at least ``MIN_FIT_BYTES`` the model misses by more than 2x is marked an outlier, and
    as many are listed with their file:line."""
    marked = 0
    for line in out.split("\n"):
        fields = line.split()
        if len(fields) >= 4 and fields[0].isdigit() and line.startswith("  "):
            outlier = line.endswith("outlier, left out")
            ratio = float(fields[-4] if outlier else fields[-1])
            marked += outlier
            if int(fields[0]) >= MIN_FIT_BYTES and not outlier:
                assert 0.495 <= ratio <= 2.005, line  # the ratio printed is rounded to 2 decimals
    listed = [line for line in out.split("\n") if line.startswith("  ") and " bytes measured " in line]
    assert len(listed) == marked and all(":" in line.split(" bytes measured ")[0] for line in listed), out


def fuzz_logs(examples: int) -> None:
    # What the command imports, imported outside the memory limit and the time measured.
    import toast.cost.calibration  # noqa: F401
    import toast.output.files  # noqa: F401
    import toast.output.profile_file  # noqa: F401
    import toast.output.report  # noqa: F401

    tally = {"fit": 0, "refused": 0}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(nccl_logs() | st.sampled_from(SPECIAL_FILES), min_size=1, max_size=2))
    def fuzz(logs):
        with tempfile.TemporaryDirectory() as folder:
            base = Path(folder) / "base.toml"
            base.write_text(BASE)
            paths = []
            for index, log in enumerate(logs):
                if log == "a FIFO with no writer":
                    os.mkfifo(Path(folder) / f"fifo{index}")
                    paths.append(str(Path(folder) / f"fifo{index}"))
                    continue
                if isinstance(log, str):
                    paths.append(log)
                    continue
                name, contents = log
                (Path(folder) / str(index)).mkdir()
                path = Path(folder) / str(index) / name
                path.write_bytes(contents)
                paths.append(str(path))
            output = Path(folder) / "out.toml"
            code, out, err, seconds = run_calibrate(["--nccl-tests", *paths, "--base", str(base), "-o", str(output)])
            assert_result_or_one_error(code, out, err, seconds, output)
            if code == 0:
                assert_outliers_reported(out)
            tally["fit" if code == 0 else "refused"] += 1

    fuzz()
    assert tally["fit"] > 0 and tally["refused"] > 0, tally  # the generator reaches both ends


def fuzz_documents(examples: int) -> None:
    import toast.cost.microbench  # noqa: F401 (jax's import, once, outside the memory limit)

    tally = {"fit": 0, "refused": 0}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(microbench_documents())
    def fuzz(contents):
        with tempfile.TemporaryDirectory() as folder:
            document, output = Path(folder) / "microbench.json", Path(folder) / "out.toml"
            document.write_bytes(contents)
            code, out, err, seconds = run_calibrate(["--kernels-from", str(document), "--base", "h100", "-o",
                                                     str(output)])
            if code == 0:
                measured = load_hardware(str(output))
                assert 0 < measured.matmul_efficiency <= 1 and 0 < measured.hbm_efficiency <= 1
                assert all(math.isfinite(getattr(measured, field)) and getattr(measured, field) > 0
                           for field in ("step_overhead", "kernel_overhead", "scatter_add_rate"))
            assert_result_or_one_error(code, out, err, seconds, output)
            tally["fit" if code == 0 else "refused"] += 1

    fuzz()
    assert tally["fit"] > 0 and tally["refused"] > 0, tally


def test_fuzzed_logs_end_in_a_fit_with_its_outliers_or_one_error_line():
    fuzz_logs(25)


def test_fuzzed_microbenchmark_documents_end_in_a_profile_or_one_error_line():
    fuzz_documents(60)


@pytest.mark.slow
def test_many_fuzzed_logs():
    fuzz_logs(300)


@pytest.mark.slow
def test_many_fuzzed_microbenchmark_documents():
    fuzz_documents(400)
