"""`toast calibrate`: a profile's collective parameters fitted to nccl-tests outputs.

The logs here are synthetic: nccl-tests' output format with times computed from known parameters, so the fit
must give those parameters back (``KNOWN``); the base profile starts elsewhere.
"""

from __future__ import annotations

import dataclasses
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


def test_calibrate_recovers_the_parameters_of_a_synthetic_cluster(tmp_path, base_path, capsys):
    cluster = known_cluster(load_hardware(str(base_path)))
    node = group_span(range(8), cluster)
    two_nodes = group_span([*range(8), *range(8, 16)], cluster)
    logs = []
    for binary, kind, span, hosts in (("all_gather_perf", "all-gather", node, ["a"] * 8),
                                      ("all_reduce_perf", "all-reduce", two_nodes, ["a"] * 8 + ["b"] * 8)):
        log = tmp_path / f"{binary}.log"
        # nccl-tests prints times with two decimals in microseconds: the rounding is part of the test.
        log.write_text(nccl_tests_log(binary, hosts, {s: collective_seconds(kind, s, span, cluster) for s in SIZES}))
        logs.append(str(log))
    out = tmp_path / "mycluster.toml"
    assert main(["calibrate", "--nccl-tests", *logs, "--base", str(base_path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "all-reduce, 16 ranks on 2 nodes" in printed and "model/measured" in printed
    fitted = load_hardware(str(out))
    assert fitted.name == "mycluster"
    for index, fields in KNOWN.items():
        for field, value in fields.items():
            assert getattr(fitted.interconnect[index], field) == pytest.approx(value, rel=0.05), (index, field)
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

