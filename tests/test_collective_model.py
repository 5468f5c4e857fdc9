"""Collectives on a cluster's topology (``toast.cost.network``): hand-computed times, the mesh axes' spans,
and the bundled profiles against published nccl-tests measurements.

The hand-computed tests use ``TWO_LEVEL``: round numbers, 8 devices per node joined by a 100 GB/s fabric
(1 us per step) and 8 NICs of 10 GB/s per node (10 us per step), efficiencies of 1. Expected numbers in the
published tests come from ``../shared/reference/published/published.json`` (nobody on this project measured
them).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import ONE_LEVEL, round_numbers_profile

from toast import CostModel, ShardingModel, analyze, parse_mesh
from toast.cost.calibration import read_published, with_level
from toast.cost.collectives import Collective
from toast.cost.hardware import load_hardware
from toast.cost.network import algorithms, axis_spans, best_algorithm, collective_seconds, mesh_group_span

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT.parent / "shared" / "reference" / "published" / "published.json"
GIB = 1 << 30

TWO_LEVEL = round_numbers_profile("two_level", ONE_LEVEL + """\
[[interconnect]]
level = "network"
devices = 1024
nics = 8
nic_bandwidth = 10e9
latency = 10e-6
efficiency = 1.0
small_latency = 10e-6
small_efficiency = 1.0
switch_reduction = false
sources = ["round numbers"]
""")


@pytest.fixture(scope="module")
def two_level(tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "two_level.toml"
    path.write_text(TWO_LEVEL)
    return load_hardware(str(path))


def test_a_one_gib_all_reduce_on_two_nodes_of_eight_is_hierarchical_over_all_nics(two_level):
    span = mesh_group_span([("data", 16)], ("data",), two_level)
    assert (span.devices, span.per_node, span.nodes, span.placement) == (16, 8, 2, "both")
    # Hierarchical: reduce-scatter and all-gather in the node, 2 * 7/8 * 2^30 B / 100e9 B/s = 0.01879048192 s,
    # pipelined with the all-reduce between the nodes over all 8 NICs of each, 2 * 1/2 * 2^30 B / (8 * 10e9 B/s)
    # = 0.0134217728 s: the node's phase sets the pace. Latency: 2 * 7 fabric steps of 1 us and 2 * log2(2) network
    # steps of 10 us = 34 us.
    hierarchical = 34e-6 + 2 * 7 / 8 * GIB / 100e9
    # The ring over all 16 devices: 2 * 15/16 * 2^30 B at min(100e9, 8 NICs * 10e9) = 80e9 B/s, and 2 * (14 fabric
    # steps + 1 network step) = 48 us: 0.0252138 s, slower.
    ring = 48e-6 + 2 * 15 / 16 * GIB / 80e9
    assert hierarchical == pytest.approx(0.01882448192, rel=1e-9) and ring == pytest.approx(0.0252138240, rel=1e-9)
    best = best_algorithm("all-reduce", GIB, span, two_level)
    assert best is not None and best.name == "hierarchical"
    assert collective_seconds("all-reduce", GIB, span, two_level) == pytest.approx(hierarchical, rel=1e-12)
    # One NIC's bandwidth for the whole node (the old model) would take 2^30 B / 10e9 B/s = 0.107 s between nodes.
    assert collective_seconds("all-reduce", GIB, span, two_level) < 0.2 * GIB / 10e9


def test_a_two_axis_all_reduce_is_one_collective_over_both_axes(two_level):
    """XLA emits one all-reduce whose replica group is both axes' devices: it costs what the 16-device one does."""
    one_axis = mesh_group_span([("data", 16)], ("data",), two_level)
    two_axes = mesh_group_span([("node", 2), ("gpu", 8)], ("node", "gpu"), two_level)
    assert one_axis == two_axes
    mesh = parse_mesh("node=2,gpu=8")
    model = ShardingModel(analyze("matmul", fn=lambda a, b: a @ b, args=[
        jax.ShapeDtypeStruct((512, 16), jnp.float32), jax.ShapeDtypeStruct((16, 512), jnp.float32)]), mesh)
    analysis = model.analysis
    contracting = analysis.names.def_base[analysis.program.arguments[0]] + 1
    from toast import Action

    state = model.apply(model.initial(), Action(int(analysis.color_of[contracting]), "gpu"))
    state = model.apply(state, Action(int(analysis.color_of[contracting]), "node"))
    cost = CostModel(model, two_level).evaluate(state)
    assert [(c.kind, c.axes, c.bytes_in) for c in cost.collectives] == [("all-reduce", ("node", "gpu"), 512 * 512 * 4)]
    expected = collective_seconds("all-reduce", 512 * 512 * 4, one_axis, two_level)
    assert cost.communication_s == {"node+gpu": pytest.approx(expected, rel=1e-12)}


def test_small_messages_take_the_low_latency_regime(two_level):
    """With a small-message regime of 0.2 us per step at half the bandwidth, 8 devices in one node: 64 KiB
    all-gathers in 7 * 0.2 us + 7/8 * 65536 B / 50e9 B/s = 2.547 us (large: 7 us + 0.573 us = 7.573 us), and
    1 GiB in 7 us + 7/8 * 2^30 B / 100e9 B/s = 9.402 ms (small: 18.79 ms)."""
    levels = list(two_level.interconnect)
    levels[0] = dataclasses.replace(levels[0], small_latency=0.2e-6, small_efficiency=0.5)
    hardware = dataclasses.replace(two_level, interconnect=tuple(levels))
    span = mesh_group_span([("x", 8)], ("x",), hardware)
    small = best_algorithm("all-gather", 65536, span, hardware)
    assert small is not None and small.name == "ring/small"
    assert small.seconds(65536) == pytest.approx(1.4e-6 + 7 / 8 * 65536 / 50e9, rel=1e-12)
    large = best_algorithm("all-gather", GIB, span, hardware)
    assert large is not None and large.name == "ring"
    assert large.seconds(GIB) == pytest.approx(7e-6 + 7 / 8 * GIB / 100e9, rel=1e-12)


def test_switch_reduction_sends_the_buffer_once(two_level):
    """A fabric that reduces in the switch at 0.5 of 100 GB/s with 20 us per all-reduce: 1 GiB in
    20 us + 2^30 B / 50e9 B/s = 21.495 ms, against the ring's 14 us + 2 * 7/8 * 2^30 B / 100e9 B/s = 18.804 ms:
    the ring wins at that rate; at 0.7 the switch does (15.359 ms)."""
    levels = list(two_level.interconnect)
    span = mesh_group_span([("x", 8)], ("x",), two_level)
    for efficiency, expected, name in ((0.5, 14e-6 + 1.75 * GIB / 100e9, "ring"),
                                       (0.7, 20e-6 + GIB / 70e9, "switch")):
        levels[0] = dataclasses.replace(levels[0], switch_reduction=True, switch_latency=20e-6,
                                        switch_efficiency=efficiency)
        hardware = dataclasses.replace(two_level, interconnect=tuple(levels))
        best = best_algorithm("all-reduce", GIB, span, hardware)
        assert best is not None and best.name == name
        assert best.seconds(GIB) == pytest.approx(expected, rel=1e-12)
    # All-gathers never use the switch.
    assert {a.name for a in algorithms("all-gather", span, hardware)} == {"ring", "ring/small"}


@pytest.mark.parametrize(("mesh", "expected"), [
    ("batch=4,model=2", {"batch": ("node", 4, 1), "model": ("node", 2, 1)}),
    ("data=2,model=8", {"data": ("network", 1, 2), "model": ("node", 8, 1)}),
    ("data=4,model=4", {"data": ("both", 2, 2), "model": ("node", 4, 1)}),
    ("data=32,model=8", {"data": ("network", 1, 32), "model": ("node", 8, 1)}),
    ("data=16", {"data": ("both", 8, 2)}),
    ("model=8,data=4", {"model": ("both", 2, 4), "data": ("node", 4, 1)}),  # devices 0, 4, 8, ..., 28
])
def test_each_axis_stays_in_a_node_spans_nodes_or_both(mesh, expected):
    """Devices row-major over the mesh (as jax.make_mesh lays them out), 8 per h100 node."""
    spans = axis_spans(parse_mesh(mesh).axes, load_hardware("h100"))
    assert {axis: (span.placement, span.per_node, span.nodes) for axis, span in spans.items()} == expected


def test_combined_axes_span_their_product():
    h100 = load_hardware("h100")
    span = mesh_group_span([("data", 4), ("model", 4)], ("data", "model"), h100)
    assert (span.devices, span.per_node, span.nodes, span.levels(h100)) == (16, 8, 2, "nvlink+infiniband")


# Published measurements: every bundled profile within 0.75-1.33 of the published time at 16 MiB, 256 MiB and
# 1 GiB, and within 2x at 1 MiB.
def _published():
    if not PUBLISHED.is_file():
        return []
    return read_published(PUBLISHED)


def _system(entry):
    hardware = load_hardware(entry.profile)
    if entry.network_bandwidth is not None:
        hardware = with_level(hardware, 1, bandwidth=entry.network_bandwidth)
    return hardware


@pytest.mark.skipif(not PUBLISHED.is_file(), reason="../shared/reference/published is not beside the checkout")
@pytest.mark.parametrize("entry", _published(), ids=lambda entry: entry.id)
def test_bundled_profiles_match_published_collectives(entry):
    hardware = _system(entry)
    curve = entry.curve
    mesh = parse_mesh(f"x={curve.ranks}")
    model = ShardingModel(analyze("one", fn=lambda a: a * 2.0, args=[jax.ShapeDtypeStruct((8,), jnp.float32)]), mesh)
    costs = CostModel(model, hardware)
    span = mesh_group_span(mesh.axes, ("x",), hardware)
    assert (span.devices, span.nodes) == (curve.ranks, curve.nodes)
    measured = dict(zip(curve.sizes, curve.seconds, strict=True))
    for size, low, high in ((1 << 20, 0.5, 2.0), (16 << 20, 0.75, 1.33), (256 << 20, 0.75, 1.33), (GIB, 0.75, 1.33)):
        gathered = curve.kind == "all-gather"
        collective = Collective(kind=curve.kind, axes=("x",), value=0, op=0, operand=-1,
                                bytes_in=size // curve.ranks if gathered else size, bytes_out=size)
        ratio = costs.collective_time(collective) / measured[size]
        assert low <= ratio <= high, f"{entry.id} at {size} B: {ratio:.2f}"


@pytest.mark.skipif(not PUBLISHED.is_file(), reason="../shared/reference/published is not beside the checkout")
@pytest.mark.parametrize("entry", [e for e in _published() if e.curve.kind == "all-reduce"], ids=lambda e: e.id)
def test_a_program_whose_only_collective_is_the_published_all_reduce(entry):
    """``toast cost`` on a matmul whose contracting dim is split over every device: its only collective is an
    all-reduce of the 256 MiB f32 result, priced within 0.75-1.33 of the published time."""
    from toast import Action

    curve = entry.curve
    size = 256 << 20
    rows = size // 4 // 1024
    model = ShardingModel(analyze("matmul", fn=lambda a, b: a @ b, args=[
        jax.ShapeDtypeStruct((rows, curve.ranks), jnp.float32),
        jax.ShapeDtypeStruct((curve.ranks, 1024), jnp.float32)]), parse_mesh(f"x={curve.ranks}"))
    analysis = model.analysis
    contracting = analysis.names.def_base[analysis.program.arguments[0]] + 1
    state = model.apply(model.initial(), Action(int(analysis.color_of[contracting]), "x"))
    cost = CostModel(model, _system(entry)).evaluate(state)
    assert [(c.kind, c.bytes_in) for c in cost.collectives] == [("all-reduce", size)]
    ratio = cost.communication_s["x"] / dict(zip(curve.sizes, curve.seconds, strict=True))[size]
    assert 0.75 <= ratio <= 1.33, f"{ratio:.2f}"
    assert math.isclose(cost.communication_s["x"], collective_seconds("all-reduce", size, mesh_group_span(
        model.mesh.axes, ("x",), _system(entry)), _system(entry)), rel_tol=1e-12)
