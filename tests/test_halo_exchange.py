"""Halo exchanges (issue 36, item 10): a convolution whose window is wider than one row along a spatial dim of
one size in and out (a causal or SAME convolution, stride 1, no dilation) maps that dim to the result's; split,
each device needs its neighbours' edge rows, which XLA's partitioner exchanges with collective-permutes.

The program: a depthwise 1-D convolution along the sequence of x: f32[B=2, S=64, C=8] with a kernel f32[W, 1, 8],
on the mesh seq=4,model=2 with S split over seq (16 rows per device). A halo of h rows moves h x B x C x 4 bytes =
h x 64 bytes to a neighbour. Expected values are worked out by hand from these shapes.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import pytest

from toast import Action, ShardingModel, ToastError, analyze, load_hardware, parse_mesh
from toast.cost.model import CostModel
from toast.cost.network import algorithms, mesh_group_span
from toast.facts.writer import program_facts
from toast.output.sharded_stablehlo import sharded_module_text
from toast.output.strategy_file import read_strategy_document, strategy_json
from toast.xla.validate import compare
from toast.xla.worker import check_sharded_module

A100 = load_hardware("a100_80gb")
MESH = "seq=4,model=2"


def _conv(window: int, low: int, high: int, *, stride: int = 1, dilation: int = 1):
    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, window_strides=(stride,), padding=[(low, high)],
                                            rhs_dilation=(dilation,), dimension_numbers=("NWC", "WIO", "NWC"),
                                            feature_group_count=x.shape[-1])

    return conv, (jax.ShapeDtypeStruct((2, 64, 8), jnp.float32), jax.ShapeDtypeStruct((window, 1, 8), jnp.float32))


def _analysis(window: int, low: int, high: int, **kwargs):
    fn, args = _conv(window, low, high, **kwargs)
    return analyze(f"conv_w{window}_{low}_{high}", fn=fn, args=args, engine="embedded", cache=False)


def _sequence_split(window: int, low: int, high: int):
    """The model and the state with x's sequence dim (and so the result's) split over seq."""
    analysis = _analysis(window, low, high)
    model = ShardingModel(analysis, parse_mesh(MESH))
    x = analysis.program.arguments[0]
    color = int(analysis.color_of[analysis.names.def_base[x] + 1])
    return model, model.apply(model.initial(), Action(color, "seq"))


def _same_color(analysis, dim: int) -> bool:
    """x's dim ``dim`` and the result's have one color."""
    program, names = analysis.program, analysis.names
    x, out = program.arguments[0], program.ops[0].results[0]
    return bool(analysis.color_of[names.def_base[x] + dim] == analysis.color_of[names.def_base[out] + dim])


def test_the_padding_of_a_convolution_is_a_fact():
    analysis = _analysis(4, 3, 0)
    facts, _ = program_facts(analysis.program)
    conv = next(op.id for op in analysis.program.ops if op.kind == "stablehlo.convolution")
    # lhs spatial dim 1, stride 1, padded 3 before and 0 after, no dilation.
    assert facts["conv_window"] == [(conv, 1, 1, 3, 0, 0)]


@pytest.mark.parametrize("window, low, high", [(4, 3, 0), (4, 1, 2), (3, 1, 1)])
def test_a_causal_or_same_window_maps_the_dim_and_states_its_halo(window, low, high):
    analysis = _analysis(window, low, high)
    conv = next(op.id for op in analysis.program.ops if op.kind == "stablehlo.convolution")
    assert analysis.halo_dims == ((conv, 0, 1, low, high),)
    assert _same_color(analysis, 1)


@pytest.mark.parametrize("window, low, high, kwargs", [
    (1, 0, 0, {}),  # one row wide: a map with no halo
    (4, 2, 0, {}),  # the result is a row shorter: not one size
    (4, 3, 0, {"stride": 2}),  # strided: the result is a quarter the size
    (2, 2, 0, {"dilation": 2}),  # a dilated window
])
def test_other_windows_state_no_halo(window, low, high, kwargs):
    analysis = _analysis(window, low, high, **kwargs)
    assert analysis.halo_dims == ()
    assert _same_color(analysis, 1) == (window == 1)


@pytest.mark.parametrize("window, low, high, expected", [
    # Causal, window 4: 3 rows from the lower neighbour, 3 x 2 x 8 x 4 = 192 bytes.
    (4, 3, 0, [("collective-permute", ("seq",), 192, 192)]),
    # SAME, window 4: 1 row from below (64 bytes), 2 from above (128 bytes).
    (4, 1, 2, [("collective-permute", ("seq",), 64, 64), ("collective-permute", ("seq",), 128, 128)]),
    # One row wide: no halo, and no gather either.
    (1, 0, 0, []),
])
def test_a_split_sequence_exchanges_halos_instead_of_gathering(window, low, high, expected):
    model, state = _sequence_split(window, low, high)
    cost = CostModel(model, A100).evaluate(state)
    assert [(c.kind, c.axes, c.bytes_in, c.bytes_out) for c in cost.collectives] == expected


def test_a_halo_is_priced_as_a_point_to_point_transfer_in_the_node():
    """seq is 4 GPUs of one NVLink node: one step of the fabric and 192 bytes at its bus bandwidth; the cheaper of
    the two regimes (large and small messages)."""
    fabric = A100.interconnect[0]
    span = mesh_group_span([("seq", 4), ("model", 2)], ("seq",), A100)
    large = fabric.latency + 192 / (fabric.efficiency * fabric.bandwidth)
    small = fabric.small_latency + 192 / (fabric.small_efficiency * fabric.bandwidth)
    found = algorithms("collective-permute", span, A100)
    assert [a.name for a in found] == ["point-to-point", "point-to-point/small"]
    assert min(a.seconds(192) for a in found) == pytest.approx(min(large, small), rel=1e-12)
    model, state = _sequence_split(4, 3, 0)
    costs = CostModel(model, A100)
    (halo,) = costs.evaluate(state).collectives
    assert costs.collective_time(halo) == pytest.approx(min(large, small), rel=1e-12)


@pytest.mark.parametrize("window, low, high, count", [(4, 3, 0, 1), (4, 1, 2, 2), (1, 0, 0, 0)])
def test_xla_exchanges_the_predicted_halos(window, low, high, count):
    """XLA's partitioner exchanges the same halos (collective-permutes over seq of the bytes above) and holds, while
    the convolution runs, the local shard widened by the halo rows (16 + 3 rows: 1,216 bytes) beside x (1,024), the
    kernel (128) and the result (1,024): 3,392 bytes; with no halo, 2,080 (the kernel is 32 bytes)."""
    model, state = _sequence_split(window, low, high)
    costs = CostModel(model, A100)
    cost = costs.evaluate(state)
    report = check_sharded_module(sharded_module_text(model, state, communication=costs.communication),
                                  model.mesh.axes)
    assert report.numerics.match
    agreement = compare(cost.collectives, cost.peak_bytes, report, tolerance=0.1)
    assert agreement.matched == agreement.predicted_count == agreement.xla_count == count
    assert {c.kind for c in report.collectives} <= {"collective-permute"}
    assert cost.peak_bytes == (3392 if count else 2080)


def test_a_strategy_file_carries_the_halo_and_refuses_an_uneven_one():
    model, state = _sequence_split(4, 3, 0)
    cost = CostModel(model, A100).evaluate(state)
    document = strategy_json(model, state, state.actions, cost, source="conv", hardware=A100, name="seq")
    (halo,) = document["collectives"]
    assert (halo["kind"], halo["axes"], halo["bytes_in"], halo["bytes_out"]) == (
        "collective-permute", ["seq"], 192, 192)
    assert read_strategy_document(copy.deepcopy(document))["collectives"] == [halo]
    broken = copy.deepcopy(document)
    broken["collectives"][0]["bytes_out"] = 768
    with pytest.raises(ToastError, match=r"collectives\[0\] \(collective-permute over seq\) takes 192 "
                                         r"bytes per device to 768; a collective-permute receives as many bytes as "
                                         r"it sends\."):
        read_strategy_document(broken)
