"""The batch over several mesh axes, FSDP over several, and meshes laid over several slices (issue 37 item 5).

MaxText's two-slice TPU v4 run (T15 in ../shared/reference/published/maxtext.json) is ``dcn_data 2 x ici_fsdp
64``: the batch over ``data`` x ``fsdp``, the parameters stored over ``fsdp``, and ``data`` across the two slices,
over DCN. Expected times are worked by hand from hardware/tpu_v4.toml's levels (ICI: W = 9e10 B/s per chip, 1 us
per step; DCN: 6.25e9 B/s per chip, 9.6 us per step; both at efficiency 1) and the alpha-beta formulas of
toast/cost/network.py: an all-reduce over a ring of n devices, k per slice on m slices, takes
``2 ((n - m) a_ici + (m - 1) a_dcn) + 2 (n - 1)/n S / min(W_ici, k W_dcn)``, hierarchically ``2 (k - 1) a_ici +
2 ceil(log2 m) a_dcn + S max(2 (k - 1)/k / W_ici, 2 (m - 1)/m / (k W_dcn))``, the faster of the two.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast
from toast.cli.app import main
from toast.cost.network import collective_seconds, mesh_group_span
from toast.errors import ToastError
from toast.output.strategy_file import (
    read_strategy_document,
    schema_problem,
    strategy_json,
    strategy_mesh,
    strategy_state,
)
from toast.search.actions import ActionSpace
from toast.search.base import Budget, SpaceSettings
from toast.search.exhaustive import enumerate_states
from toast.search.find import find_strategy
from toast.sharding.roles import load_roles
from toast.sharding.state import ShardNodes
from toast.sharding.strategies import check_strategy

V4 = toast.load_hardware("tpu_v4")
ICI_W, ICI_A = 9e10, 1e-6      # hardware/tpu_v4.toml [[interconnect]] ici: bandwidth, latency
DCN_W, DCN_A = 6.25e9, 9.6e-6  # hardware/tpu_v4.toml [[interconnect]] dcn
T15 = [("data", 2), ("fsdp", 64)]
W_BYTES = 256 * 512 * 4  # grad_step's w, f32


def grad_step(*, batch: int = 64):
    """One SGD step of ``sum(tanh(x @ w))``: the gradient ``x^T g`` sums over the batch, so a batch split over
    axes A all-reduces ``w``'s gradient (256 x 512 f32, 524288 bytes) over A."""

    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

    return step, (jax.ShapeDtypeStruct((256, 512), jnp.float32), jax.ShapeDtypeStruct((batch, 256), jnp.float32))


def narrow_step():
    """Weights whose dims no axis of 2 divides (5, 7, 3), a batch of 2**20 rows: only the batch can be split,
    and splitting it over every device is the fastest strategy."""

    def step(w, v, x):
        gw, gv = jax.grad(lambda w, v: jnp.sum(jnp.tanh(x @ w) @ v), argnums=(0, 1))(w, v)
        return w - 0.1 * gw, v - 0.1 * gv

    return step, (jax.ShapeDtypeStruct((5, 7), jnp.float32), jax.ShapeDtypeStruct((7, 3), jnp.float32),
                  jax.ShapeDtypeStruct((1 << 20, 5), jnp.float32))


@functools.cache
def analysis_of(factory: str):
    fn, args = {"grad_step": grad_step, "narrow_step": narrow_step}[factory]()
    return toast.analyze(factory, fn=fn, args=args, engine="embedded")


def batch_roles(*axes: str, params: tuple[str, ...] = ()) -> toast.Roles:
    table = {"batch": list(axes)} if axes else {}
    if params:
        table["params"] = list(params)
    return toast.Roles({"batch": [("x", 0)]}, source="test roles", axes=table)


def argument_specs(model, state) -> dict[str, tuple]:
    program = model.analysis.program
    return {program.values[v].name: model.value_axes(state, v) for v in program.arguments}


# --- where slices are, and what crosses them ---------------------------------------------------------------------


def test_slice_shape_is_the_dcn_mesh_shape_of_the_leading_axes():
    assert toast.parse_mesh("data=2,fsdp=64", slices=2).slice_shape() == (2, 1)
    assert toast.parse_mesh("data=2,fsdp=64", slices=4).slice_shape() == (2, 2)  # fsdp: 2 slices x 32 chips
    assert toast.parse_mesh("data=2,fsdp=64").slice_shape() == (1, 1)
    assert toast.parse_mesh("data=2,fsdp=64", slices=2).label() == "data=2,fsdp=64 on 2 slices"


@pytest.mark.parametrize(("mesh", "slices", "why"), [
    ("data=2,fsdp=4", 3, "3 slices do not split it along its leading axes"),
    ("data=6,fsdp=2", 4, "4 slices do not split it along its leading axes"),  # 3 devices a slice: half an fsdp pair
    ("data=2,fsdp=4", 0, "0 slices; give a whole number from 1 to its 8 devices"),
    ("data=2,fsdp=4", 16, "16 slices; give a whole number from 1 to its 8 devices"),
])
def test_slices_that_do_not_split_the_mesh_are_refused(mesh, slices, why):
    with pytest.raises(ToastError, match=why) as error:
        toast.parse_mesh(mesh, slices=slices)
    assert "\n" not in str(error.value)


def test_one_slice_of_128_chips_prices_every_axis_on_ici():
    """What toast did before slices: tpu_v4's ICI level joins 4096 chips (a pod), so the 128 chips of T15 were
    one node and its data axis, which MaxText lays across two slices, was priced on ICI."""
    for axes in (("data",), ("fsdp",), ("data", "fsdp")):
        assert mesh_group_span(T15, axes, V4).levels(V4) == "ici"


def test_an_axis_across_two_slices_is_on_dcn():
    data = mesh_group_span(T15, ("data",), V4, slices=2)
    fsdp = mesh_group_span(T15, ("fsdp",), V4, slices=2)
    both = mesh_group_span(T15, ("data", "fsdp"), V4, slices=2)
    assert (data.devices, data.per_node, data.nodes, data.levels(V4)) == (2, 1, 2, "dcn")
    assert (fsdp.devices, fsdp.per_node, fsdp.nodes, fsdp.levels(V4)) == (64, 64, 1, "ici")
    assert (both.devices, both.per_node, both.nodes, both.levels(V4)) == (128, 64, 2, "ici+dcn")


def test_all_reduce_across_two_slices_by_hand():
    size = 64 * 2 ** 20  # bytes
    across = mesh_group_span(T15, ("data",), V4, slices=2)
    # Ring of 2, one chip per slice: 2 DCN steps, 2 (1/2) S over one chip's DCN (the tree is the same here).
    assert math.isclose(collective_seconds("all-reduce", size, across, V4), 2 * DCN_A + size / DCN_W)
    inside = mesh_group_span(T15, ("data",), V4)
    assert math.isclose(collective_seconds("all-reduce", size, inside, V4), 2 * ICI_A + size / ICI_W)
    # Both levels, 64 chips a slice: hierarchical, ICI-bound (each chip sends S/64 over DCN).
    both = mesh_group_span(T15, ("data", "fsdp"), V4, slices=2)
    hierarchical = 2 * 63 * ICI_A + 2 * DCN_A + size * max(2 * 63 / 64 / ICI_W, 2 * (1 / 2) / (64 * DCN_W))
    ring = 2 * (126 * ICI_A + DCN_A) + 2 * 127 / 128 * size / min(ICI_W, 64 * DCN_W)
    assert hierarchical < ring
    assert math.isclose(collective_seconds("all-reduce", size, both, V4), hierarchical)


def test_all_gather_across_two_slices_by_hand():
    size = 2 ** 20  # the gathered buffer, bytes
    across = mesh_group_span(T15, ("data",), V4, slices=2)
    assert math.isclose(collective_seconds("all-gather", size, across, V4), DCN_A + size / 2 / DCN_W)


def test_gpu_nodes_as_slices_change_nothing():
    """G1's dcn_fsdp 16 x ici_fsdp 8 on H100s: 16 slices of one 8-GPU node each are the profile's own nodes."""
    h100 = toast.load_hardware("h100")
    mesh = [("fsdp", 128)]
    assert mesh_group_span(mesh, ("fsdp",), h100, slices=16) == mesh_group_span(mesh, ("fsdp",), h100)


def test_a_slice_the_profile_cannot_hold_is_refused():
    v5e = toast.load_hardware("tpu_v5e")  # ICI joins one 256-chip pod
    with pytest.raises(ToastError, match="a slice of 512 devices is more than the 256 that the tpu_v5e "
                                         "profile's ici level joins"):
        mesh_group_span([("data", 2), ("fsdp", 512)], ("data",), v5e, slices=2)
    one_level = dataclasses.replace(V4, interconnect=V4.interconnect[:1])
    with pytest.raises(ToastError, match="has one interconnect level"):
        mesh_group_span(T15, ("data",), one_level, slices=2)


# --- the cost model -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("batch_axes", "slices", "level", "seconds"), [
    # Before slices (one slice): the data axis on ICI, a ring of 2.
    (("data",), 1, "ici", 2 * ICI_A + W_BYTES / ICI_W),
    # data across 2 slices: a ring of 2 over DCN.
    (("data",), 2, "dcn", 2 * DCN_A + W_BYTES / DCN_W),
    # data x fsdp, 2 chips in each of 2 slices: hierarchical (reduce-scatter on ICI, all-reduce on DCN, all-gather).
    (("data", "fsdp"), 2, "ici+dcn", 2 * ICI_A + 2 * DCN_A + W_BYTES * max(1 / ICI_W, 1 / (2 * DCN_W))),
])
def test_gradient_all_reduce_priced_on_the_levels_it_crosses(batch_axes, slices, level, seconds):
    analysis = analysis_of("grad_step")
    model = toast.ShardingModel(analysis, toast.parse_mesh("data=2,fsdp=2", slices=slices))
    state, _ = toast.manual_strategy(model, "data_parallel", batch_roles(*batch_axes))
    cost = toast.CostModel(model, V4).evaluate(state)
    assert [(c.kind, c.axes, c.bytes_in) for c in cost.collectives] == [("all-reduce", batch_axes, W_BYTES)]
    assert dict(cost.communication_by_level_s).keys() == {level}
    assert math.isclose(cost.communication_s["+".join(batch_axes)], seconds)


# --- roles and strategies on several axes -------------------------------------------------------------------------


def test_batch_on_the_data_axis_by_default():
    model = toast.ShardingModel(analysis_of("grad_step"), toast.parse_mesh("data=2,fsdp=2"))
    state, actions = toast.manual_strategy(model, "data_parallel", batch_roles())
    assert argument_specs(model, state)["x"] == (("data",), ())
    assert [a.axis for a in actions] == ["data"]


def test_batch_on_two_axes():
    model = toast.ShardingModel(analysis_of("grad_step"), toast.parse_mesh("data=2,fsdp=2"))
    state, actions = toast.manual_strategy(model, "data_parallel", batch_roles("data", "fsdp"))
    assert argument_specs(model, state) == {"w": ((), ()), "x": (("data", "fsdp"), ())}
    assert [a.axis for a in actions] == ["data", "fsdp"]


def test_fsdp_stores_on_the_params_axes():
    """T15: the batch over data x fsdp, the parameters over fsdp alone (on w's largest dim, 512)."""
    model = toast.ShardingModel(analysis_of("grad_step"), toast.parse_mesh("data=2,fsdp=2", slices=2))
    state, _ = toast.manual_strategy(model, "fsdp", batch_roles("data", "fsdp", params=("fsdp",)))
    assert argument_specs(model, state) == {"w": ((), ("fsdp",)), "x": (("data", "fsdp"), ())}


def test_fsdp_stores_over_the_batch_axes_by_default():
    """No params axes: the batch's, one dim split over both (ZeRO-3 over all 4 devices)."""
    model = toast.ShardingModel(analysis_of("grad_step"), toast.parse_mesh("data=2,fsdp=2"))
    state, actions = toast.manual_strategy(model, "fsdp", batch_roles("data", "fsdp"))
    assert argument_specs(model, state)["w"] == ((), ("data", "fsdp"))
    stored = [a for a in actions if isinstance(a, ShardNodes)]
    assert [(a.axis, a.label) for a in stored] == [("data", "w:1 and its update"), ("fsdp", "w:1 and its update")]


def test_fsdp_over_axes_no_dim_divides_takes_the_leading_ones():
    """w is 256 x 512: no dim divisible by data x fsdp = 2 x 3, so it is stored over data alone."""
    model = toast.ShardingModel(analysis_of("grad_step"), toast.parse_mesh("data=2,fsdp=3"))
    state, _ = toast.manual_strategy(model, "fsdp", batch_roles("data", params=("data", "fsdp")))
    assert argument_specs(model, state) == {"w": ((), ("data",)), "x": (("data",), ())}


def test_axes_table_in_a_roles_file(tmp_path):
    path = tmp_path / "t15.roles.toml"
    path.write_text('[roles]\nbatch = ["x:0"]\n\n[axes]\nbatch = ["data", "fsdp"]\nparams = "fsdp"\n')
    roles = load_roles(path)
    assert (roles.axes_of("batch"), roles.axes_of("params"), roles.axes_of("heads")) == (("data", "fsdp"),
                                                                                          ("fsdp",), ())
    again = tmp_path / "again.roles.toml"
    again.write_text(roles.to_toml())
    assert load_roles(again).axes == roles.axes


@pytest.mark.parametrize(("axes_table", "why"), [
    ('batch = ["data", "data"]', r"\[axes\] batch names a mesh axis twice"),
    ('bogus = ["data"]', r"\[axes\] has unknown key 'bogus' \(known: batch, heads, mlp, sequence, experts, params\)"),
    ("batch = [1]", r"\[axes\] batch should be a list of mesh axis names"),
    ("batch = []", r"\[axes\] batch should be a list of mesh axis names"),
])
def test_bad_axes_table(tmp_path, axes_table, why):
    path = tmp_path / "bad.roles.toml"
    path.write_text(f'[roles]\nbatch = ["x:0"]\n\n[axes]\n{axes_table}\n')
    with pytest.raises(ToastError, match=f"^{path}: {why}"):
        load_roles(path)


def test_axes_the_mesh_lacks_are_named_before_any_analysis():
    with pytest.raises(ToastError, match=r"test roles: \[axes\] batch names mesh axis 'fsdp', which the mesh "
                                         "data=4 lacks"):
        check_strategy("fsdp", roles=batch_roles("data", "fsdp"), mesh=toast.parse_mesh("data=4"))


def test_model_axis_skips_every_batch_axis():
    """Megatron's default model axis is the first axis the batch leaves; none left is a one-line error."""
    analysis = analysis_of("grad_step")
    roles = toast.Roles({"batch": [("x", 0)], "mlp": [("w", 1)]}, source="test roles",
                        axes={"batch": ["data", "fsdp"]})
    model = toast.ShardingModel(analysis, toast.parse_mesh("data=2,fsdp=2,model=2"))
    state, _ = toast.manual_strategy(model, "megatron", roles)
    assert argument_specs(model, state) == {"w": ((), ("model",)), "x": (("data", "fsdp"), ())}
    with pytest.raises(ToastError, match=r"the batch takes every axis of mesh data=2,fsdp=2 \(data, fsdp\)"):
        toast.manual_strategy(toast.ShardingModel(analysis, toast.parse_mesh("data=2,fsdp=2")), "megatron", roles)


# --- the search and strategy files --------------------------------------------------------------------------------


def test_search_reaches_the_batch_on_two_axes():
    analysis = analysis_of("narrow_step")
    mesh = toast.parse_mesh("data=2,fsdp=2")
    model = toast.ShardingModel(analysis, mesh)
    manual, _ = toast.manual_strategy(model, "data_parallel", batch_roles("data", "fsdp"))
    space = ActionSpace(model, min_names=1)
    costs = toast.CostModel(model, V4)
    states = enumerate_states(space, costs)
    reached = {states.atoms[i].tobytes() for i in range(len(states))}
    assert manual.masks[space.partition.first_name].tobytes() in reached
    best = space.state(states.atoms[states.optimum(V4.hbm_bytes)])
    assert np.array_equal(best.masks, manual.masks)  # the fastest state: the batch over all 4 devices
    found = find_strategy(analysis, mesh, V4, budget=Budget(rollouts=100),
                          space_settings=SpaceSettings(min_names=1), manual_candidates=False)
    assert np.array_equal(found.result.state.masks, manual.masks)
    assert [a.axis for a in found.result.state.actions] == ["data", "fsdp"]


def test_strategy_file_round_trips_a_color_on_two_axes_and_the_slices():
    model = toast.ShardingModel(analysis_of("grad_step"), toast.parse_mesh("data=2,fsdp=2", slices=2))
    state, actions = toast.manual_strategy(model, "fsdp", batch_roles("data", "fsdp", params=("fsdp",)))
    cost = toast.CostModel(model, V4).evaluate(state)
    document = json.loads(json.dumps(strategy_json(model, state, actions, cost, source="test", hardware=V4,
                                                   name="fsdp")))
    assert document["mesh"] == {"axes": [["data", 2], ["fsdp", 2]], "slices": 2}
    assert [t["partition_spec"] for t in document["arguments"]] == [[None, "fsdp"], [["data", "fsdp"], None]]
    read = read_strategy_document(document)
    assert strategy_mesh(read, path="test") == model.mesh
    assert np.array_equal(strategy_state(model, read, path="test").masks, state.masks)
    one_slice = toast.ShardingModel(model.analysis, toast.parse_mesh("data=2,fsdp=2"))
    assert "slices" not in strategy_json(one_slice, state, actions, cost, source="test", hardware=V4,
                                         name="fsdp")["mesh"]


# --- the command line ---------------------------------------------------------------------------------------------


def test_cli_slices(tmp_path, capsys):
    roles = tmp_path / "r.roles.toml"
    roles.write_text('[roles]\nbatch = ["x:0"]\n\n[axes]\nbatch = ["data"]\n')
    out = tmp_path / "s.json"
    common = ["tests.test_multi_axis:grad_step", "--engine", "embedded", "--hardware", "tpu_v4"]
    assert main(["shard", *common, "--mesh", "data=2,fsdp=2", "--slices", "2", "--roles", str(roles),
                 "-o", str(out)]) == 0
    assert "on mesh data=2,fsdp=2 on 2 slices (tpu_v4)" in capsys.readouterr().out
    priced = tmp_path / "cost.json"
    assert main(["cost", *common, "--strategy", str(out), "--json", str(priced)]) == 0  # the file's slices
    printed = capsys.readouterr().out
    assert "on mesh data=2,fsdp=2 on 2 slices" in printed
    assert "(2 devices, 1 per slice: dcn)" in printed
    document = json.loads(priced.read_text())
    assert document["mesh"] == {"axes": [["data", 2], ["fsdp", 2]], "slices": 2}
    assert schema_problem(document, "cost") == ""
    assert math.isclose(document["communication_by_level_s"]["dcn"], 2 * DCN_A + W_BYTES / DCN_W)
    assert main(["cost", *common, "--strategy", str(out), "--slices", "1"]) == 0  # the user's
    assert "(2 devices, 2 per node: ici)" in capsys.readouterr().out
    assert main(["cost", *common, "--mesh", "data=2,fsdp=2", "--slices", "3", "--strategy", "data_parallel",
                 "--roles", str(roles)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("toast: error: mesh data=2,fsdp=2: 3 slices do not split it") and error.count("\n") == 1
