"""`toast calibrate`: a profile's collective parameters fitted to nccl-tests outputs.

The logs here are synthetic: nccl-tests' output format with times computed from known parameters, so the fit
must give those parameters back (``KNOWN``); the base profile starts elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import round_numbers_profile

from toast.cli import main
from toast.cost.calibration import read_nccl_tests
from toast.cost.hardware import load_hardware
from toast.cost.network import collective_seconds, group_span

BASE = round_numbers_profile("base", """\
# The node: 8 devices on a 100 GB/s fabric.
[[interconnect]]
level = "nvlink"
devices = 8
bandwidth = 100e9
latency = 3e-6     # a guess
efficiency = 0.85
small_latency = 3e-6
small_efficiency = 0.85
switch_reduction = false
sources = ["a datasheet"]
[[interconnect]]
level = "network"
devices = 1024
nics = 4
nic_bandwidth = 10e9
latency = 10e-6
efficiency = 0.9
small_latency = 10e-6
small_efficiency = 0.9
switch_reduction = false
sources = ["a datasheet", "a second one"]
""")
# The cluster the logs come from: level -> fields.
KNOWN = {0: {"efficiency": 0.7, "latency": 6e-6, "small_efficiency": 0.35, "small_latency": 1.5e-6},
         1: {"efficiency": 0.8, "latency": 50e-6, "small_efficiency": 0.3, "small_latency": 20e-6}}
SIZES = [1 << k for k in range(10, 31)]  # 1 KiB .. 1 GiB, doubling


def nccl_tests_log(binary: str, hosts: list[str], seconds: dict[int, float]) -> str:
    """An nccl-tests output: the header with one '#  Rank' line per rank, then one row per size."""
    ranks = [f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {host:>10} device {r % 8:2d} [0x{r:02x}] Test GPU"
             for r, host in enumerate(hosts)]
    header = [f"# mpirun -np {len(hosts)} ./build/{binary} -b 1K -e 1G -f 2 -g 1",
              "# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 "
              "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices", *ranks,
              "NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>", "#",
              "#                                                              out-of-place                       "
              "in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
              "algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
              "(GB/s)  (GB/s)       "]
    rows = []
    for size, time in seconds.items():
        us = time * 1e6
        algbw = size / time / 1e9
        rows.append(f"{size:>12} {size // 4:>13}     float     sum      -1 {us:8.2f} {algbw:7.2f} {algbw:7.2f}      0 "
                    f"{us:8.2f} {algbw:7.2f} {algbw:7.2f}      0")
    return "\n".join([*header, *rows, "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.3456", ""])


def known_cluster(base):
    levels = list(base.interconnect)
    for index, fields in KNOWN.items():
        levels[index] = dataclasses.replace(levels[index], **fields)
    return dataclasses.replace(base, interconnect=tuple(levels))


@pytest.fixture
def base_path(tmp_path):
    path = tmp_path / "base.toml"
    path.write_text(BASE)
    return path


def synthetic_logs(tmp_path: Path, base_path: Path, seconds=lambda size, time: time) -> list[str]:
    """An all-gather on one node and an all-reduce on two of the ``KNOWN`` cluster, each row's time
    ``seconds(size, model's time)``."""
    cluster = known_cluster(load_hardware(str(base_path)))
    node = group_span(range(8), cluster)
    two_nodes = group_span([*range(8), *range(8, 16)], cluster)
    logs = []
    for binary, kind, span, hosts in (("all_gather_perf", "all-gather", node, ["a"] * 8),
                                      ("all_reduce_perf", "all-reduce", two_nodes, ["a"] * 8 + ["b"] * 8)):
        log = tmp_path / f"{binary}.log"
        # nccl-tests prints times with two decimals in microseconds: the rounding is part of the test.
        log.write_text(nccl_tests_log(binary, hosts, {s: seconds(s, collective_seconds(kind, s, span, cluster))
                                                      for s in SIZES}))
        logs.append(str(log))
    return logs


def assert_known(fitted) -> None:
    for index, fields in KNOWN.items():
        for field, value in fields.items():
            assert getattr(fitted.interconnect[index], field) == pytest.approx(value, rel=0.05), (index, field)


def test_calibrate_recovers_the_parameters_of_a_synthetic_cluster(tmp_path, base_path, capsys):
    logs = synthetic_logs(tmp_path, base_path)
    out = tmp_path / "mycluster.toml"
    assert main(["calibrate", "--nccl-tests", *logs, "--base", str(base_path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "all-reduce, 16 ranks on 2 nodes" in printed and "model/measured" in printed
    assert "outlier" not in printed  # every row fits
    fitted = load_hardware(str(out))
    assert fitted.name == "mycluster"
    assert_known(fitted)
    # What was not fitted is the base's; the fit is cited in the fitted levels' sources.
    assert fitted.interconnect[1].nics == 4 and fitted.interconnect[0].bandwidth == 100e9
    text = out.read_text()
    assert "C1: toast calibrate on all_gather_perf.log, all_reduce_perf.log" in text
    assert '"a second one"' in text and "# The node: 8 devices on a 100 GB/s fabric." in text


def test_the_log_tells_the_collective_ranks_and_nodes(tmp_path):
    log = tmp_path / "run1.txt"
    log.write_text(nccl_tests_log("reduce_scatter_perf", ["x"] * 4 + ["y"] * 4, {1 << 20: 1e-4, 1 << 21: 2e-4}))
    curve = read_nccl_tests(log)
    assert (curve.kind, curve.ranks, curve.nodes, curve.sizes) == ("reduce-scatter", 8, 2, (1 << 20, 1 << 21))
    assert curve.seconds == pytest.approx((1e-4, 2e-4))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda text: text.replace("     float     sum      -1   100.00", "     float     sum      -1   fast", 1),
     "{log}:18: not an nccl-tests data row"),
    (lambda text: "\n".join(line for line in text.split("\n") if "Rank" not in line),
     "{log}: no '#  Rank N Group N Pid N on HOST device N' lines"),
    (lambda text: "\n".join(line for line in text.split("\n") if not line[:1].isspace() or "#" in line),
     "{log}: no nccl-tests data rows"),
    (lambda text: text.replace("all_reduce_perf", "mystery_perf"), "{log}: cannot tell which collective"),
])
def test_an_unreadable_log_is_one_line_naming_the_file(tmp_path, base_path, capsys, edit, message):
    log = tmp_path / "run.log"
    log.write_text(edit(nccl_tests_log("all_reduce_perf", ["a"] * 8, {1 << 20: 1e-4, 1 << 21: 2e-4})))
    out = tmp_path / "out.toml"
    assert main(["calibrate", "--nccl-tests", str(log), "--base", str(base_path), "-o", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("toast: error: " + message.format(log=log)), error
    assert error.count("\n") == 1 and not out.exists()


def test_calibrate_needs_a_toml_output_and_ranks_that_fit_the_node(tmp_path, base_path, capsys):
    log = tmp_path / "all_gather_perf.log"
    log.write_text(nccl_tests_log("all_gather_perf", ["a"] * 16 + ["b"] * 16, {1 << 20: 1e-4}))
    assert main(["calibrate", "--nccl-tests", str(log), "--base", str(base_path), "-o", str(tmp_path / "x.json")]) == 2
    assert "a profile is a .toml file" in capsys.readouterr().err
    assert main(["calibrate", "--nccl-tests", str(log), "--base", str(base_path), "-o", str(tmp_path / "x.toml")]) == 2
    assert "16 ranks per node, but a node of profile 'base' holds 8 devices" in capsys.readouterr().err


def test_kernel_numbers_from_a_saved_microbenchmark_run(tmp_path, capsys):
    """The H100's microbenchmarks (benchmarks/data/h100_microbench.json) give back the [kernels] numbers an
    earlier session worked out from them by hand (the h100 profile's [M1] comments: 0.70 of the bf16 peak for an
    8192^3 matmul, 0.79 of HBM for a 2^28-element f32 kernel, 1.7 us per kernel from the 100- and 400-kernel
    chains, 74 us for a one-kernel program, 2.06e11 and 1.02e11 atomic updates per second); every other number
    of the base stays."""
    out = tmp_path / "measured.toml"
    saved = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100_microbench.json"
    assert main(["calibrate", "--kernels-from", str(saved), "--base", "h100", "-o", str(out)]) == 0
    assert "kernels measured on NVIDIA H100 80GB HBM3" in capsys.readouterr().out
    measured = load_hardware(str(out))
    by_hand = {"matmul_efficiency": 0.70, "hbm_efficiency": 0.79, "kernel_overhead": 1.7e-6, "step_overhead": 74e-6,
               "scatter_add_rate": 2.06e11, "scatter_add_rate_16bit": 1.02e11}
    for field, value in by_hand.items():
        assert getattr(measured, field) == pytest.approx(value, rel=0.05), field
    h100 = load_hardware("h100")
    assert (measured.matmul_overhead, measured.f32_matmul, measured.interconnect) == (
        h100.matmul_overhead, h100.f32_matmul, h100.interconnect)


def test_calibrate_needs_measurements_and_an_accelerator_for_kernels(tmp_path, capsys):
    out = tmp_path / "x.toml"
    assert main(["calibrate", "--base", "h100", "-o", str(out)]) == 2
    assert "calibrate needs measurements: --nccl-tests LOG..., --kernels or --kernels-from JSON" in \
        capsys.readouterr().err
    assert main(["calibrate", "--kernels", "--base", "h100", "-o", str(out)]) == 2  # jax sees the CPU only here
    assert "jax sees none here" in capsys.readouterr().err and not out.exists()



# Issue 36: logs and documents read within limits and checked, outliers reported, the profile always TOML.

def calibrate(capsys, *args: str) -> tuple[int, str, str]:
    """``toast calibrate ARGS``: (exit status, stdout, stderr)."""
    code = main(["calibrate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error(code: int, out: str, err: str, message: str, output: Path) -> None:
    """Exit 2, nothing on stdout, one line ``toast: error: MESSAGE...`` and no profile written."""
    assert code == 2 and out == "", (code, out)
    assert err.startswith(f"toast: error: {message}") and err.count("\n") == 1, err
    assert not output.exists()


FOUR_AND_FOUR = ["a"] * 4 + ["b"] * 4
FIRST_ROW = "     1048576        262144     float     sum      -1   100.00"  # line 18 of an 8-rank log


def duplicate_rank_3(text: str) -> str:
    lines = text.split("\n")
    return "\n".join([*lines[:8], lines[7], *lines[8:]])  # rank 3 is line 8, its copy line 9


@pytest.mark.parametrize(("hosts", "edit", "message"), [
    # A row's numbers no run prints (each a traceback or a silently wrong fit before).
    (FOUR_AND_FOUR, lambda t: t.replace(FIRST_ROW, FIRST_ROW.replace("  100.00", "  1e-320")),
     "{log}:18: a time of '1e-320' us: a time must be 0.001 to 1e+10 us"),
    (FOUR_AND_FOUR, lambda t: t.replace(FIRST_ROW, FIRST_ROW.replace("  100.00", "     nan")),
     "{log}:18: a time of 'nan' us"),
    (FOUR_AND_FOUR, lambda t: t.replace(FIRST_ROW, FIRST_ROW.replace("     1048576", "1" + "0" * 400)),
     "{log}:18: a size of '100000000000000000000...' bytes: a size must be 1 to 2^48 bytes"),
    (FOUR_AND_FOUR, lambda t: t.replace(FIRST_ROW, FIRST_ROW.replace("     1048576", "1" + "0" * 30)),
     "{log}:18: a size of '100000000000000000000...' bytes: a size must be 1 to 2^48 bytes"),
    (FOUR_AND_FOUR, lambda t: t.replace(FIRST_ROW, FIRST_ROW.replace("     1048576", "    -1048576")),
     "{log}:18: a size of '-1048576' bytes: a size must be 1 to 2^48 bytes"),
    (FOUR_AND_FOUR, lambda t: t.replace(FIRST_ROW, FIRST_ROW.replace("     1048576", "       1e400")),
     "{log}:18: the size '1e400' is not a whole number of bytes"),
    # 1 GiB in 10 ns is 1e17 bytes/s.
    (FOUR_AND_FOUR, lambda t: t.replace(FIRST_ROW, FIRST_ROW.replace("     1048576", "  1073741824")
                                        .replace("  100.00", "    0.01")),
     "{log}:18: 1073741824 bytes in 0.01 us is 1.07e+17 bytes/s, faster than any link (1e+15)"),
    # Rank layouts no single run prints.
    (["a"], lambda t: t, "{log}: one rank: a collective needs at least 2"),
    (["a"] * 5 + ["b"] * 3, lambda t: t,
     "{log}: 8 ranks spread unevenly over 2 hosts (ranks per host: a: 5, b: 3); toast needs the same number on each"),
    (FOUR_AND_FOUR, duplicate_rank_3, "{log}:9: rank 3 listed again (first at line 8): one nccl-tests run per file"),
    (FOUR_AND_FOUR, lambda t: "\n".join(line for line in t.split("\n") if "Rank  5" not in line),
     "{log}: 7 '#  Rank' lines, but no rank 5: ranks are numbered 0 to 6"),
    (FOUR_AND_FOUR, lambda t: t.replace("# Using devices", "# then ./all_gather_perf -b 8"),
     "{log}: names all_reduce_perf (line 1) and all_gather_perf (line 4): one nccl-tests run per file"),
])
def test_a_log_no_run_prints_is_refused_naming_file_and_line(tmp_path, base_path, capsys, hosts, edit, message):
    log = tmp_path / "run.log"
    log.write_text(edit(nccl_tests_log("all_reduce_perf", hosts, {1 << 20: 1e-4, 1 << 21: 2e-4})))
    out = tmp_path / "out.toml"
    assert_one_error(*calibrate(capsys, "--nccl-tests", str(log), "--base", str(base_path), "-o", str(out)),
                     message.format(log=log), out)


def test_host_prefixed_nccl_lines_between_the_rows_are_skipped(tmp_path):
    """NCCL's INFO lines start with the host name, which may start with a digit; they are no data rows."""
    text = nccl_tests_log("all_reduce_perf", FOUR_AND_FOUR, {1 << 20: 1e-4, 1 << 21: 2e-4})
    log = tmp_path / "run.log"
    log.write_text(text.replace(FIRST_ROW, "10-0-0-1:1234:1234 [0] NCCL INFO comm 0x1 rank 0\n" + FIRST_ROW))
    curve = read_nccl_tests(log)
    assert (curve.sizes, curve.lines) == ((1 << 20, 1 << 21), (19, 20))


@pytest.mark.parametrize(("line", "message"), [
    (b"NCCL INFO " + b"x" * 70_000, "{log}:13: a line longer than 65536 bytes: not a nccl-tests output"),
    (b"NCCL INFO \xff\xfe", "{log}:13: not UTF-8 text"),
    (b"NCCL INFO \x00\x00", "{log}:13: a NUL byte: not a text file"),
])
def test_a_line_no_run_prints_is_refused(tmp_path, base_path, capsys, line, message):
    """A huge line, bytes that are not UTF-8, NUL bytes (a binary file): refused at their line, where they
    were skipped (or the whole file refused without a line) before."""
    lines = nccl_tests_log("all_reduce_perf", FOUR_AND_FOUR, {1 << 20: 1e-4}).encode().split(b"\n")
    log = tmp_path / "run.log"
    log.write_bytes(b"\n".join([*lines[:12], line, *lines[12:]]))
    out = tmp_path / "out.toml"
    assert_one_error(*calibrate(capsys, "--nccl-tests", str(log), "--base", str(base_path), "-o", str(out)),
                     message.format(log=log), out)


def test_a_log_past_the_limits_is_refused_before_it_is_read(tmp_path, base_path, capsys, monkeypatch):
    from toast.cost import calibration

    out = tmp_path / "out.toml"
    args = ["--base", str(base_path), "-o", str(out)]
    # A regular file over the limit: refused by its size, nothing read (a sparse file: instant to make).
    big = tmp_path / "all_reduce_perf.log"
    with open(big, "wb") as stream:
        stream.truncate((64 << 20) + 1)
    assert_one_error(*calibrate(capsys, "--nccl-tests", str(big), *args),
                     f"{big}: 67108865 bytes, more than the 67108864 a nccl-tests output may have", out)
    text = nccl_tests_log("all_reduce_perf", FOUR_AND_FOUR, {1 << 20: 1e-4, 1 << 21: 2e-4})  # 21 lines
    log = tmp_path / "run.log"
    log.write_text(text)
    monkeypatch.setattr(calibration, "MAX_LOG_LINES", 10)
    assert_one_error(*calibrate(capsys, "--nccl-tests", str(log), *args),
                     f"{log}: more than the 10 lines a nccl-tests output may have", out)
    monkeypatch.setattr(calibration, "MAX_LOG_LINES", 1000)
    monkeypatch.setattr(calibration, "MAX_ROWS", 1)
    assert_one_error(*calibrate(capsys, "--nccl-tests", str(log), *args),
                     f"{log}:19: more than 1 data rows: one nccl-tests run per file", out)
    # A pipe (what `--nccl-tests <(ssh node cat log)` reads): no size to check, so the bytes read are counted.
    monkeypatch.setattr(calibration, "MAX_LOG_BYTES", 1000)
    reader, writer = os.pipe()
    try:
        os.write(writer, text.encode())
        os.close(writer)
        piped = f"/dev/fd/{reader}"
        assert_one_error(*calibrate(capsys, "--nccl-tests", piped, *args),
                         f"{piped}: more than the 1000 bytes a nccl-tests output may have", out)
    finally:
        os.close(reader)


# Each case in a child process with 2 GiB of address space and a time limit: before, /dev/zero grew without
# end and a FIFO with no writer waited forever (and a folder was a traceback once the reading was bounded).
_CHILD = """
import contextlib, io, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from toast.cli import main
found = []
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        found.append((main(["calibrate", *args]), err.getvalue()))
print(json.dumps(found))
"""


def test_a_device_or_a_fifo_is_read_within_the_limits(tmp_path, base_path):
    fifo = tmp_path / "all_reduce_perf.log"
    os.mkfifo(fifo)
    out = str(tmp_path / "out.toml")
    cases = [(["--nccl-tests", "/dev/zero", "--base", str(base_path), "-o", out],
              "/dev/zero:1: a line longer than 65536 bytes: not a nccl-tests output"),
             (["--nccl-tests", str(fifo), "--base", str(base_path), "-o", out],
              f"{fifo}: no '#  Rank N Group N Pid N on HOST device N' lines"),
             (["--kernels-from", "/dev/zero", "--base", str(base_path), "-o", out],
              "/dev/zero: more than the 16777216 bytes a microbenchmark document may have"),
             (["--kernels-from", str(fifo), "--base", str(base_path), "-o", out],
              f"{fifo}:1:1: not JSON: Expecting value"),
             (["--nccl-tests", str(tmp_path), "--base", str(base_path), "-o", out],
              f"{tmp_path}: cannot read the nccl-tests output: Is a directory"),
             (["--kernels-from", str(tmp_path), "--base", str(base_path), "-o", out],
              f"{tmp_path}: cannot read the microbenchmark document: Is a directory")]
    child = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([args for args, _ in cases])],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert child.returncode == 0, child.stderr[-2000:]
    for (code, err), (_, message) in zip(json.loads(child.stdout.splitlines()[-1]), cases, strict=True):
        assert code == 2 and err.startswith(f"toast: error: {message}") and err.count("\n") == 1, err
    assert not Path(out).exists()


def test_rows_the_fit_cannot_explain_are_reported_and_left_out(tmp_path, base_path, capsys):
    """One row of each log 50 times too fast (a broken run): the fit leaves them out, names them, and gives the
    cluster's parameters back as if they were not there; before, they bent it."""
    broken = 1 << 28
    logs = synthetic_logs(tmp_path, base_path, seconds=lambda size, time: time / 50 if size == broken else time)
    out = tmp_path / "mycluster.toml"
    code, printed, err = calibrate(capsys, "--nccl-tests", *logs, "--base", str(base_path), "-o", str(out))
    assert code == 0 and err == "", err
    assert_known(load_hardware(str(out)))
    # Rows begin on line 18 of the 8-rank log and line 26 of the 16-rank one; 2^28 is the 19th size.
    assert "2 outliers left out of the fit (the model fitted to the other rows misses them by more than 2x):" \
        in printed
    gather, reduce = (f"  {logs[0]}:36: 268435456 bytes measured", f"  {logs[1]}:44: 268435456 bytes measured")
    assert sum(line.startswith(gather) for line in printed.split("\n")) == 1
    assert sum(line.startswith(reduce) for line in printed.split("\n")) == 1
    marked = [line.split()[0] for line in printed.split("\n") if line.endswith("outlier, left out")]
    assert marked == [str(broken), str(broken)]


H100_DOCUMENT = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100_microbench.json"


def edited_case(name: str, field: str, value):
    def edit(document: dict) -> str:
        next(case for case in document["cases"] if case["name"] == name)[field] = value
        return json.dumps(document)
    return edit


@pytest.mark.parametrize(("edit", "message"), [
    # A TypeError (a string divided) and a ValueError (a string formatted with :.3g in the error message)
    # before.
    (edited_case("matmul_bf16_8192x8192x8192", "flops", "1e12"),
     "cases[0] ('matmul_bf16_8192x8192x8192'): flops must be a number from 0 to 1e+24, not '1e12'"),
    (edited_case("matmul_bf16_8192x8192x8192", "seconds", "1e-9"),
     "cases[0] ('matmul_bf16_8192x8192x8192'): seconds must be a number from 1e-09 to 10000, not '1e-9'"),
    # matmul_efficiency = 1.0 before.
    (edited_case("matmul_bf16_8192x8192x8192", "flops", 1e308),
     "cases[0] ('matmul_bf16_8192x8192x8192'): flops must be a number from 0 to 1e+24, not 1e+308"),
    # In range, but 1e20 FLOPs in 1.6507 ms less the 74 us step and 1.7 us kernel overheads is 6.35e22 FLOP/s:
    # 6.4e7 times the H100's 9.89e14.
    (edited_case("matmul_bf16_8192x8192x8192", "flops", 1e20),
     "microbenchmark 'matmul_bf16_8192x8192x8192': 1e+20 FLOPs in 0.00165 s is 6.41e+07 of profile 'h100''s peak "
     "(9.89e+14 FLOPs/s): another device's measurements, or wrong numbers"),
    (edited_case("tiny_chain_400", "kernels", True),
     "cases[70] ('tiny_chain_400'): kernels must be a whole number from 0 to 1e+07, not True"),
    (lambda document: "[" * 100_000 + "]" * 100_000, "not a microbenchmark document (RecursionError)"),
    (lambda document: '{\n  "cases": [1,,2]\n}', "{doc}:2:15: not JSON: Expecting value"),
])
def test_a_microbenchmark_document_is_checked_before_use(tmp_path, capsys, edit, message):
    document = tmp_path / "microbench.json"
    document.write_text(edit(json.loads(H100_DOCUMENT.read_text())))
    out = tmp_path / "out.toml"
    where = message.format(doc=document) if message.startswith("{doc}") else f"{document}: {message}"
    assert_one_error(*calibrate(capsys, "--kernels-from", str(document), "--base", "h100", "-o", str(out)), where,
                     out)


def test_a_profile_named_after_any_log_reads_back_as_toml(tmp_path, base_path, capsys):
    """Quotes, a backslash, a ']' and '#' (which ended the sources list when a profile was read again),
    characters past the BMP and an undecodable byte (a lone surrogate in Python) in the log's name; quotes and
    accents in the profile's: the profile written reads back with tomllib, names as given (the byte as
    U+FFFD), and serves as the base of another calibration."""
    cluster = known_cluster(load_hardware(str(base_path)))
    node = group_span(range(8), cluster)
    name = 'all_gather_perf nccl-é-日本 "q" \\ ]# 😀 \udcff.log'
    log = tmp_path / name
    log.write_text(nccl_tests_log("all_gather_perf", ["a"] * 8,
                                  {s: collective_seconds("all-gather", s, node, cluster) for s in SIZES}))
    first, second = tmp_path / 'profil-é "1".toml', tmp_path / "second.toml"
    assert calibrate(capsys, "--nccl-tests", str(log), "--base", str(base_path), "-o", str(first))[0] == 0
    data = tomllib.loads(first.read_text(encoding="utf-8"))
    entry = data["interconnect"][0]["sources"][0]
    assert data["name"] == 'profil-é "1"'
    assert entry.startswith('C1: toast calibrate on all_gather_perf nccl-é-日本 "q" \\ ]# 😀 \ufffd.log (')
    assert load_hardware(str(first)).name == 'profil-é "1"'
    assert calibrate(capsys, "--nccl-tests", str(log), "--base", str(first), "-o", str(second))[0] == 0
    sources = tomllib.loads(second.read_text(encoding="utf-8"))["interconnect"][0]["sources"]
    assert sources[1:] == [entry, "a datasheet"] and sources[0] == entry
