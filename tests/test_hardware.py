"""Accelerator profiles (hardware/*.toml) and their loader, toast.cost.hardware."""

from __future__ import annotations

import re
import tomllib

import pytest

from toast import ToastError, known_hardware, load_hardware
from toast.cost.hardware import DEFAULT_HOST_BANDWIDTH
from toast.cost.network import axis_spans
from toast.resources import resource_dir

BUNDLED = [
    "a100_40gb", "a100_80gb", "b200", "h100", "h200", "p100", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e",
    "v100",
]

USER_PROFILE = """\
name = "mygpu"
description = "a test GPU"
[compute]
bf16 = 100e12
f32 = 10e12
sources = ["a datasheet"]
[memory]
hbm_bytes = 24e9
hbm_bandwidth = 1e12
sources = ["a datasheet"]
[kernels]
matmul_efficiency = 0.6
matmul_overhead = 2e-6
f32_matmul = "f32"
hbm_efficiency = 0.8
kernel_overhead = 2e-6
step_overhead = 5e-5
scatter_add_rate = 1e11
scatter_add_rate_16bit = 5e10
sources = ["a measurement"]
[compiler]
combine_threshold = 1e6
sources = ["a compiler's default"]
[[interconnect]]
level = "nvlink"
devices = 4
bandwidth = 100e9
latency = 3e-6
efficiency = 0.8
small_latency = 1e-6
small_efficiency = 0.4
switch_reduction = true
switch_latency = 20e-6
switch_efficiency = 0.6
sources = ["a datasheet"]
[[interconnect]]
level = "ethernet"
devices = 64
nics = 2
nic_bandwidth = 25e9
latency = 10e-6
efficiency = 0.9
small_latency = 5e-6
small_efficiency = 0.3
switch_reduction = false
sources = ["a datasheet"]
"""


def test_bundled_profiles_are_known():
    assert known_hardware() == BUNDLED


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_profile_loads_with_positive_numbers(name):
    hardware = load_hardware(name)
    assert hardware.name == name and hardware.description
    assert {"bf16", "f32"} <= set(hardware.peak_flops)
    assert all(flops > 0 for flops in hardware.peak_flops.values())
    assert hardware.hbm_bytes > 0 and hardware.hbm_bandwidth > 0
    assert hardware.interconnect
    for level in hardware.interconnect:
        assert level.devices >= 1 and level.bandwidth > 0 and level.latency > 0
    devices = [level.devices for level in hardware.interconnect]
    assert devices == sorted(set(devices)), "levels go innermost first"


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_profile_cites_sources_in_every_section(name):
    data = tomllib.loads((resource_dir("hardware") / f"{name}.toml").read_text())
    sections = [data["compute"], data["memory"], data["compiler"], data["host"], *data["interconnect"]]
    for section in sections:
        assert section["sources"]
        for source in section["sources"]:
            # A web source, the repository's fit of the collective parameters (BENCHMARKS.md), or a measurement.
            assert re.fullmatch(r"[SVX]\d+: https?://\S+|F1: benchmarks/fit_collectives\.py .*"
                                r"|M\d+: benchmarks/data/\S+\.json .*", source), source


def test_datasheet_ordering():
    peak = {name: load_hardware(name).peak_flops for name in BUNDLED}
    assert peak["h100"]["bf16"] > peak["a100_80gb"]["bf16"] > peak["v100"]["f16"] > peak["p100"]["f16"]
    assert peak["b200"]["bf16"] > peak["h100"]["bf16"]
    assert load_hardware("h200").hbm_bytes > load_hardware("h100").hbm_bytes
    assert load_hardware("a100_80gb").hbm_bandwidth > load_hardware("a100_40gb").hbm_bandwidth
    assert peak["tpu_v4"]["bf16"] > peak["tpu_v3"]["bf16"]
    assert peak["tpu_v5p"]["bf16"] > peak["tpu_v4"]["bf16"]
    # Trillium: 4.7x v5e's peak per chip, twice its HBM and ICI (the v5e and v6e pages of Cloud TPU's docs).
    v5e, v6e = load_hardware("tpu_v5e"), load_hardware("tpu_v6e")
    assert (peak["tpu_v6e"]["bf16"], v6e.hbm_bytes, v6e.hbm_bandwidth) == (918e12, 32e9, 1638e9)
    assert peak["tpu_v6e"]["bf16"] / peak["tpu_v5e"]["bf16"] == pytest.approx(4.66, abs=0.01)
    assert v6e.hbm_bytes == 2 * v5e.hbm_bytes


def test_flops_falls_back_for_unlisted_dtypes():
    h100, a100, v5e = load_hardware("h100"), load_hardware("a100_80gb"), load_hardware("tpu_v5e")
    assert h100.flops("bf16") == 989e12
    assert h100.flops("f8E4M3FN") == h100.peak_flops["f8"]
    assert a100.flops("f8E5M2") == a100.peak_flops["bf16"]
    assert a100.flops("f64") == a100.peak_flops["f32"] / 2
    assert a100.flops("i32") == a100.peak_flops["f32"]
    assert v5e.flops("i8") == 394e12
    assert v5e.flops("f32") == pytest.approx(v5e.flops("bf16") / 3, rel=0.01)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ToastError, match=r"^unknown hardware 'tpu_v9' \(known: a100_40gb, a100_80gb, .*v100\)$"):
        load_hardware("tpu_v9")


def test_missing_file_by_path(tmp_path):
    with pytest.raises(ToastError, match="no such hardware profile"):
        load_hardware(str(tmp_path / "absent.toml"))


def test_malformed_toml_gives_path_and_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('name = "broken"\n[compute\nbf16 = 1e12\n')
    with pytest.raises(ToastError) as err:
        load_hardware(str(path))
    assert str(err.value).startswith(f"{path}:2:9: malformed hardware profile: ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("hbm_bytes = 24e9\n", "", "memory.hbm_bytes"),
        ("kernel_overhead = 2e-6\n", "", "kernels.kernel_overhead"),
        ("scatter_add_rate_16bit = 5e10\n", "", "kernels.scatter_add_rate_16bit"),
        ("hbm_efficiency = 0.8", "hbm_efficiency = 1.5", "kernels.hbm_efficiency"),
        ('f32_matmul = "f32"', 'f32_matmul = "tf32"', "kernels.f32_matmul"),
        ("[kernels]\n", "[kernelz]\n", "kernelz"),
        ("bf16 = 100e12\n", "", "compute.bf16"),
        ("bandwidth = 100e9", "bandwidth = -100e9", "interconnect[0].bandwidth"),
        ("latency = 10e-6", 'latency = "fast"', "interconnect[1].latency"),
        ("f32 = 10e12", "f32 = 0", "compute.f32"),
        ("devices = 4", "devices = 4.5", "interconnect[0].devices"),
        ('hbm_bandwidth = 1e12\nsources = ["a datasheet"]', 'hbm_bandwidth = 1e12\nsources = []', "memory.sources"),
        ('sources = ["a measurement"]', "sources = []", "kernels.sources"),
        ("hbm_bandwidth", "hbm_bandwith", "memory.hbm_bandwith"),
        ("devices = 64", "devices = 4", "interconnect[1].devices"),
        # The topology: each number named when left out or wrong.
        ("nics = 2\n", "", "interconnect[1].nics"),
        ("nic_bandwidth = 25e9\n", "", "interconnect[1].nic_bandwidth"),
        ("nics = 2", "nics = 2.5", "interconnect[1].nics"),
        ("\nefficiency = 0.9\n", "\n", "interconnect[1].efficiency"),
        ("\nefficiency = 0.8", "\nefficiency = 1.2", "interconnect[0].efficiency"),
        ("small_latency = 1e-6\n", "", "interconnect[0].small_latency"),
        ("small_efficiency = 0.3\n", "", "interconnect[1].small_efficiency"),
        ("switch_reduction = true\n", "", "interconnect[0].switch_reduction"),
        ("switch_reduction = true", 'switch_reduction = "yes"', "interconnect[0].switch_reduction"),
        ("switch_latency = 20e-6\n", "", "interconnect[0].switch_latency"),
        ("switch_efficiency = 0.6", "switch_efficiency = 0", "interconnect[0].switch_efficiency"),
        ("switch_reduction = false", "switch_reduction = false\nswitch_latency = 1e-6",
         "interconnect[1].switch_latency"),
        ("bandwidth = 100e9", "bandwidth = 100e9\nnics = 4", "interconnect[0].nics"),
        ("combine_threshold = 1e6", "combine_threshold = -1", "compiler.combine_threshold"),
        ("[compiler]\ncombine_threshold = 1e6\n", "[compiler]\n", "compiler.combine_threshold"),
        # The optional [host] table, when given, is checked like the others.
        ("[compiler]\n", '[host]\nbandwidth = 0\nsources = ["a datasheet"]\n[compiler]\n', "host.bandwidth"),
        ("[compiler]\n", '[host]\nsources = ["a datasheet"]\n[compiler]\n', "host.bandwidth"),
        ("[compiler]\n", '[host]\nbandwith = 1e9\nsources = ["a datasheet"]\n[compiler]\n', "host.bandwith"),
        ("[compiler]\n", "[host]\nbandwidth = 1e9\n[compiler]\n", "host.sources"),
        ("[compiler]\n", '[host]\nbandwidth = 1e9\nefficiency = 1.5\nsources = ["a datasheet"]\n[compiler]\n',
         "host.efficiency"),
        ('description = "a test GPU"\n', 'description = "a test GPU"\nhost = 1e9\n', "host"),
    ],
)
def test_bad_field_is_named(tmp_path, old, new, field):
    assert old in USER_PROFILE
    path = tmp_path / "mygpu.toml"
    path.write_text(USER_PROFILE.replace(old, new, 1))
    with pytest.raises(ToastError) as err:
        load_hardware(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}: ") and f"field '{field}'" in message and "\n" not in message


def test_user_profile_loads_by_path(tmp_path):
    path = tmp_path / "mygpu.toml"
    path.write_text(USER_PROFILE)
    hardware = load_hardware(str(path))
    assert hardware.name == "mygpu" and hardware.path == str(path)
    assert hardware.peak_flops == {"bf16": 100e12, "f32": 10e12}
    assert [level.name for level in hardware.interconnect] == ["nvlink", "ethernet"]
    nvlink, ethernet = hardware.interconnect
    assert (nvlink.efficiency, nvlink.small_latency, nvlink.small_efficiency) == (0.8, 1e-6, 0.4)
    assert (nvlink.switch_reduction, nvlink.switch_latency, nvlink.switch_efficiency) == (True, 20e-6, 0.6)
    # The network: 2 NICs of 25 GB/s per node of 4 devices is 12.5 GB/s per device.
    assert (ethernet.nics, ethernet.nic_bandwidth, ethernet.bandwidth) == (2, 25e9, 12.5e9)
    assert (ethernet.switch_reduction, ethernet.switch_latency) == (False, 0.0)
    assert hardware.sources == ("a datasheet", "a measurement", "a compiler's default")
    assert hardware.combine_threshold == 1e6
    assert (hardware.matmul_efficiency, hardware.f32_matmul, hardware.scatter_rate(16)) == (0.6, "f32", 5e10)
    # No [host] table (a profile written before host offloading was priced): PCIe 4.0 x16, 32 GB/s one way.
    assert (hardware.host_bandwidth, hardware.host_efficiency) == (DEFAULT_HOST_BANDWIDTH, 1.0) == (32e9, 1.0)
    path.write_text(USER_PROFILE.replace("[compiler]\n", '[host]\nbandwidth = 25e9\nsources = ["a PCIe table"]\n'
                                                          "[compiler]\n"))
    hosted = load_hardware(str(path))
    assert (hosted.host_bandwidth, hosted.host_efficiency, hosted.sources[-1]) == (25e9, 1.0, "a PCIe table")
    path.write_text(USER_PROFILE.replace("[compiler]\n", '[host]\nbandwidth = 25e9\nefficiency = 0.5\n'
                                                          'sources = ["a PCIe table"]\n[compiler]\n'))
    assert load_hardware(str(path)).host_efficiency == 0.5


def test_bundled_host_links():
    """PCIe one way per device: Gen5 x16 on H100/H200 (128 GB/s both ways on NVIDIA's pages), Gen4 x16 on A100
    (64 GB/s both ways); the scaling book's 1.5e10 B/s per TPU chip, and 32 GB/s on Trillium."""
    bandwidth = {name: load_hardware(name).host_bandwidth for name in BUNDLED}
    assert bandwidth["h100"] == bandwidth["h200"] == 64e9
    assert bandwidth["a100_40gb"] == bandwidth["a100_80gb"] == 32e9
    assert bandwidth["tpu_v4"] == bandwidth["tpu_v5e"] == bandwidth["tpu_v5p"] == 1.5e10
    assert bandwidth["tpu_v6e"] == 3.2e10
    # Measured on one H100 (benchmarks/data/h100_host_offload.json): 52.5 and 51.5 GB/s of 64, about 0.81.
    assert load_hardware("h100").host_efficiency == 0.81
    assert all(b < load_hardware(name).interconnect[0].bandwidth for name, b in bandwidth.items())


def _levels(mesh_axes, hardware):
    return {axis: span.levels(hardware) for axis, span in axis_spans(mesh_axes, hardware).items()}


def test_axis_levels_within_one_nvlink_domain():
    assert _levels([("batch", 4), ("model", 2)], load_hardware("h100")) == {"batch": "nvlink", "model": "nvlink"}


def test_axis_levels_across_nodes():
    h100 = load_hardware("h100")
    assert _levels([("data", 2), ("model", 8)], h100) == {"data": "infiniband", "model": "nvlink"}
    # The inner axis decides the stride: model spans 2 * 4 = 8 devices here, data 4 * 1.
    assert _levels([("model", 2), ("data", 4)], h100) == {"model": "nvlink", "data": "nvlink"}
    # An axis of size 1 moves nothing; a mesh beyond the outermost level still maps to it.
    assert _levels([("pipe", 1), ("data", 4096), ("model", 8)], h100) == {
        "pipe": "nvlink", "data": "infiniband", "model": "nvlink"}


def test_axis_levels_on_a_tpu_slice():
    v5e = load_hardware("tpu_v5e")
    assert _levels([("replica", 4), ("data", 16), ("model", 16)], v5e) == {
        "replica": "dcn", "data": "ici", "model": "ici"}


def test_axis_levels_rejects_bad_sizes():
    with pytest.raises(ToastError, match="mesh axis 'model'"):
        axis_spans([("model", 0)], load_hardware("h100"))
