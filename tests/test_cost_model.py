"""The kernel cost model against hand-computed times and bytes.

Every expected number below is worked out by hand from the profile ``UNIT`` (round numbers: 1e12 FLOP/s,
1e12 B/s HBM at 100%, NVLink 1e11 B/s with 1 us per step, 1 us per kernel, 10 us per step).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import ONE_LEVEL, round_numbers_profile

from toast import Action, CostModel, ShardingModel, ToastError, analyze, parse_mesh
from toast.cost.hardware import load_hardware
from toast.cost.kernels import KernelPlan, kernel_counts

UNIT = round_numbers_profile("unit", ONE_LEVEL)
STEP = 1e-5
KERNEL = 1e-6


def load_hardware_text(text):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "unit.toml"
        path.write_text(text)
        return load_hardware(str(path))


@pytest.fixture(scope="module")
def unit():
    return load_hardware_text(UNIT)


def _model(fn, shapes, mesh="d=1"):
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    analysis = analyze("test", fn=fn, args=args)
    return ShardingModel(analysis, parse_mesh(mesh))


def _shard(model, state, argument, dim, axis):
    """Shard dim ``dim`` of argument number ``argument`` (and its whole color) along ``axis``."""
    analysis = model.analysis
    name = analysis.names.def_base[analysis.program.arguments[argument]] + dim
    return model.apply(state, Action(int(analysis.color_of[name]), axis))


def matmul_seconds(m, k, n):
    """One f32 [m,k]x[k,n] matmul on UNIT: compute-bound for these sizes, plus the library overhead."""
    flops, moved = 2 * m * k * n, 4 * (m * k + k * n + m * n)
    assert flops / 1e12 > moved / 1e12
    return flops / 1e12 + KERNEL


def test_all_reduce_of_a_partial_matmul_on_two_nvlink_devices(unit):
    model = _model(lambda x, w: x @ w, [(256, 512), (512, 256)], "model=2")
    state = _shard(model, model.initial(), 0, 1, "model")  # the contracting dim
    costs = CostModel(model, unit)
    cost = costs.evaluate(state)
    assert [(c.kind, c.axes, c.bytes_in) for c in cost.collectives] == [("all-reduce", ("model",), 256 * 256 * 4)]
    # Ring all-reduce over n=2: 2 * ((n-1) * 1e-6 + (n-1)/n * 262144 B / 1e11 B/s) = 4.62144e-6 s.
    assert costs.collective_time(cost.collectives[0]) == pytest.approx(4.62144e-6)
    # Each device multiplies [256,256]x[256,256] (3.3554432e-5 s + 1 us); the result is only needed at the
    # end, so the all-reduce runs after it, exposed.
    assert cost.step_time_s == pytest.approx(3.3554432e-5 + KERNEL + 4.62144e-6 + STEP)
    assert cost.breakdown["exposed_communication_s"] == pytest.approx(4.62144e-6)
    assert cost.breakdown["hidden_communication_s"] == pytest.approx(0.0)


def test_two_independent_matmuls_cost_their_sum(unit):
    model = _model(lambda a, b, c, d: (a @ b, c @ d), [(256, 512), (512, 256), (128, 1024), (1024, 512)])
    cost = CostModel(model, unit).evaluate(model.initial())
    first, second = 6.7108864e-5 + KERNEL, 1.34217728e-4 + KERNEL  # 2*256*512*256 and 2*128*1024*512 FLOPs
    assert (first, second) == pytest.approx((matmul_seconds(256, 512, 256), matmul_seconds(128, 1024, 512)))
    assert cost.step_time_s == pytest.approx(first + second + STEP)
    assert cost.kernels == 2
    assert cost.breakdown["compute_bound_s"] == pytest.approx(6.7108864e-5 + 1.34217728e-4)
    assert cost.breakdown["launch_overhead_s"] == pytest.approx(2 * KERNEL + STEP)


@pytest.mark.parametrize("independent, overlapped", [
    # A small independent matmul (64^3: 5.24288e-7 s + 1 us) ends before the all-reduce (4.62144e-6 s):
    # the step waits for the all-reduce, max(matmul, all-reduce) after the first matmul.
    ((64, 64, 64), 4.62144e-6),
    # A large one (256x512x256: 6.7108864e-5 s + 1 us) hides the whole all-reduce.
    ((256, 512, 256), 6.7108864e-5 + KERNEL),
])
def test_a_collective_hides_behind_an_independent_matmul(unit, independent, overlapped):
    m, k, n = independent

    def fn(x, w, a, b):
        return x @ w, a @ b

    model = _model(fn, [(256, 512), (512, 256), (m, k), (k, n)], "model=2")
    state = _shard(model, model.initial(), 0, 1, "model")
    first = 3.3554432e-5 + KERNEL  # [256,256]x[256,256] per device
    second = matmul_seconds(m, k, n)
    all_reduce = 4.62144e-6
    on = CostModel(model, unit).evaluate(state)
    off = CostModel(model, unit, overlap=False).evaluate(state)
    assert [c.kind for c in on.collectives] == ["all-reduce"]
    assert on.step_time_s == pytest.approx(first + max(second, all_reduce) + STEP)
    assert on.step_time_s == pytest.approx(first + overlapped + STEP)
    assert off.step_time_s == pytest.approx(first + second + all_reduce + STEP)
    assert on.breakdown["hidden_communication_s"] == pytest.approx(min(second, all_reduce))


def test_a_gradient_all_reduce_read_through_a_view_hides_behind_later_matmuls(unit):
    """A weight gradient's first reader is a reshape to the parameter's shape, a view with no kernel of its
    own: the all-reduce is due at the kernel that reads through it, after the independent matmul, which hides
    it."""

    def fn(a, b, c, d):
        gradient = jnp.reshape(a @ b, (256, 16, 16))  # contracting dim split over model: a partial result
        other = c @ d  # an earlier layer's backward matmul, independent of the gradient
        return gradient * 2.0, other

    model = _model(fn, [(256, 512), (512, 256), (256, 512), (512, 256)], "model=2")
    state = _shard(model, model.initial(), 0, 1, "model")
    cost = CostModel(model, unit).evaluate(state)
    assert [c.kind for c in cost.collectives] == ["all-reduce"]
    # [256,256]x[256,256] per device (3.3554432e-5 s + 1 us); [256,512]x[512,256] (6.7108864e-5 s + 1 us); the
    # multiply reads and writes 256 KiB (5.24288e-7 s + 1 us). The all-reduce (2 * 1 us + 262144 B /
    # 1e11 B/s = 4.62144e-6 s) runs during the second matmul: nothing waits.
    compute = (3.3554432e-5 + KERNEL) + (6.7108864e-5 + KERNEL) + (5.24288e-7 + KERNEL)
    assert cost.step_time_s == pytest.approx(compute + STEP)
    assert cost.breakdown["exposed_communication_s"] == pytest.approx(0.0)
    assert cost.breakdown["hidden_communication_s"] == pytest.approx(4.62144e-6)


def test_the_communication_stream_takes_collectives_in_the_order_they_become_ready(unit):
    """Two gradients read in the reverse of the order they are made (as an optimizer reads them): the first
    one's all-reduce runs while the second is computed, not queued behind it."""

    def fn(a1, b1, a2, b2, c, d):
        first = a1 @ b1
        second = a2 @ b2
        other = c @ d
        return second * 2.0, first * 3.0, other

    big, small = [(1024, 2048), (2048, 1024)], [(256, 512), (512, 256)]
    model = _model(fn, [*big, *big, *small], "model=2")
    state = _shard(model, model.initial(), 0, 1, "model")
    state = _shard(model, state, 2, 1, "model")
    cost = CostModel(model, unit).evaluate(state)
    assert [c.kind for c in cost.collectives] == ["all-reduce", "all-reduce"]
    # Each all-reduce: 2 * 1 us + 4 MiB / 1e11 B/s = 4.394304e-5 s. Items: two [1024,1024]x[1024,1024] matmuls
    # per device (2.147483648e-3 s + 1 us each), the small matmul (6.7108864e-5 s + 1 us, longer than one
    # all-reduce, shorter than two), then two multiplies of 4 MiB each way (8.388608e-6 s + 1 us each). In
    # ready order the first all-reduce runs during the second matmul and the second during the small one:
    # nothing waits. (In the order of their readers, the second would run first and the first after it, ending
    # 2 * 4.394304e-5 s after the second matmul, 1.0388608e-5 s after the second multiply could start.)
    all_reduce = 2e-6 + 4 * 1024 * 1024 / 1e11
    compute = 2 * (2.147483648e-3 + KERNEL) + (6.7108864e-5 + KERNEL) + 2 * (8.388608e-6 + KERNEL)
    assert cost.step_time_s == pytest.approx(compute + STEP)
    assert cost.breakdown["hidden_communication_s"] == pytest.approx(2 * all_reduce)


def test_a_hundred_small_all_reduces_are_combined_into_few():
    """100 independent partial matmuls whose results are only returned: XLA's combiner joins their
    all-reduces up to its threshold (1024 B here: four 256 B all-reduces a group)."""
    combining = load_hardware_text(UNIT.replace("combine_threshold = 0", "combine_threshold = 1024"))

    def fn(x, *weights):
        return [x @ w for w in weights]

    model = _model(fn, [(8, 2)] + [(2, 8)] * 100, "model=2")
    state = _shard(model, model.initial(), 0, 1, "model")  # the contracting dim of every matmul
    cost = CostModel(model, combining).evaluate(state)
    assert len(cost.collectives) == 100 and {c.kind for c in cost.collectives} == {"all-reduce"}
    assert {c.bytes_in for c in cost.collectives} == {8 * 8 * 4}
    # 25 all-reduces of 1024 B on 2 devices: 25 * (2 * 1 us + 1024 B / 1e11 B/s) = 5.0256e-5 s, where 100 of
    # 256 B would take 100 * (2 us + 256 B / 1e11 B/s) = 2.00256e-4 s.
    assert cost.collectives_launched == 25
    assert cost.communication_s == {"model": pytest.approx(25 * (2e-6 + 1024 / 1e11))}
    uncombined = CostModel(model, load_hardware_text(UNIT)).evaluate(state)
    assert uncombined.collectives_launched == 100
    assert uncombined.communication_s == {"model": pytest.approx(100 * (2e-6 + 256 / 1e11))}


def test_dependent_all_reduces_are_not_combined():
    """The second matmul reads the first one's all-reduced result: its all-reduce cannot wait for the first
    one's group, so both run, however high the threshold."""
    combining = load_hardware_text(UNIT.replace("combine_threshold = 0", "combine_threshold = 1e9"))

    def fn(x, w1, w2):
        first = x @ w1
        return (x * jnp.sum(first)) @ w2

    model = _model(fn, [(8, 64), (64, 8), (64, 8)], "model=2")
    state = _shard(model, model.initial(), 0, 1, "model")  # both matmuls' contracting dim
    cost = CostModel(model, combining).evaluate(state)
    assert [c.kind for c in cost.collectives] == ["all-reduce", "all-reduce"]
    assert cost.collectives_launched == 2


def test_micro_batches_run_the_step_but_the_optimizer_and_the_gradient_reduction_k_times(unit):
    """Gradient accumulation over 4 micro-batches: the forward and backward matmuls run 4 times, the gradient
    all-reduce and the update once."""

    def step(w, x):
        gradient = jnp.einsum("bi,bj->ij", x, x @ w)  # contracts the batch: a partial sum per device
        return w - 0.1 * gradient

    model = _model(step, [(512, 512), (256, 512)], "data=2")
    state = _shard(model, model.initial(), 1, 0, "data")  # the batch
    one = CostModel(model, unit).evaluate(state)
    four = CostModel(model, unit, microbatches=4).evaluate(state)
    # Per device: [128,512]x[512,512] and [512,128]x[128,512] (6.7108864e-5 s + 1 us each); the all-reduce of the
    # 1 MiB gradient (2 * 1 us + 1048576 B / 1e11 B/s = 1.248576e-5 s), which the update waits for; the update
    # reads w and the gradient and writes the new w (3 MiB at 1e12 B/s = 3.145728e-6 s + 1 us).
    matmuls = 2 * (6.7108864e-5 + KERNEL)
    last = matmuls + 1.248576e-5 + (3.145728e-6 + KERNEL)
    assert [c.kind for c in one.collectives] == ["all-reduce"]
    assert one.step_time_s == pytest.approx(last + STEP)
    # Three more micro-batches: the matmuls alone.
    assert four.step_time_s == pytest.approx(last + 3 * matmuls + STEP)
    assert four.breakdown["exposed_communication_s"] == pytest.approx(1.248576e-5)
    assert four.breakdown["compute_bound_s"] == pytest.approx(8 * 6.7108864e-5)
    with pytest.raises(ToastError, match="micro-batches 0"):
        CostModel(model, unit, microbatches=0)


def test_a_fused_elementwise_chain_costs_one_kernels_bytes(unit):
    model = _model(lambda x: jnp.tanh(x * 2.0 + 1.0) - x, [(1024, 1024)])
    costs = CostModel(model, unit)
    cost = costs.evaluate(model.initial())
    assert kernel_counts(costs.plan) == {"fusion": 1}
    # One kernel reads x and writes the result: 2 * 4 MiB at 1e12 B/s; the multiply, add, tanh and the
    # broadcast constants never reach memory.
    assert cost.step_time_s == pytest.approx(2 * 4 * 1024 * 1024 / 1e12 + KERNEL + STEP)
    assert cost.breakdown["memory_bound_s"] == pytest.approx(8.388608e-6)
    assert cost.peak_bytes == 2 * 4 * 1024 * 1024  # the argument and the result, nothing in between


def test_a_reduction_takes_its_elementwise_producers(unit):
    model = _model(lambda x: jnp.sum(jnp.exp(x) * 3.0, axis=1), [(1024, 1024)])
    costs = CostModel(model, unit)
    cost = costs.evaluate(model.initial())
    assert kernel_counts(costs.plan) == {"reduction": 1}
    assert cost.step_time_s == pytest.approx((4 * 1024 * 1024 + 4 * 1024) / 1e12 + KERNEL + STEP)


def test_donated_parameters_share_the_new_parameters_buffers(unit):
    model = _model(lambda p, g: p - 0.1 * g, [(1024, 1024), (1024, 1024)])
    size = 4 * 1024 * 1024
    assert CostModel(model, unit).evaluate(model.initial()).peak_bytes == 3 * size  # p, g and the new p
    assert CostModel(model, unit, donate=[0]).evaluate(model.initial()).peak_bytes == 2 * size


def test_loop_bodies_run_once_per_iteration(unit):
    def fn(x):
        return jax.lax.fori_loop(0, 10, lambda i, v: jnp.tanh(v) * 2.0, x)

    model = _model(fn, [(1024, 1024)])
    plan = KernelPlan(model.analysis.program, semantics=model.analysis.kernel_semantics)
    (loop,) = plan.loops.values()
    assert (loop.trip_count, loop.trip_count_known) == (10, True)
    body = [k for k in plan.kernels if k.loop == loop.op]
    assert body and all(k.repeats == 10 for k in body)
    assert kernel_counts(plan)["fusion"] >= 10
    cost = CostModel(model, unit).evaluate(model.initial())
    # At least the body's ten passes over the 4 MiB carry (read and write).
    assert cost.step_time_s > 10 * (2 * 4 * 1024 * 1024 / 1e12 + KERNEL)
    # The carry is one buffer, not one per iteration: argument, loop carry and result.
    assert cost.peak_bytes <= 3 * 4 * 1024 * 1024 + 64



def _pool(h):
    return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def _pool_gradient(x, g):
    return jax.vjp(_pool, x)[1](g)[0]


def _relu_pool_gradient(x, g):
    return jax.vjp(lambda v: _pool(jax.nn.relu(v)), x)[1](g)[0]


N, M = 8 * 32 * 32 * 16, 8 * 16 * 16 * 16  # elements of x [8,32,32,16] and of the pooled g [8,16,16,16]
SELECTION = 2 * (1 + 4) * 4 * M  # (value + 4 indices) x 32 bits per pooled element, written then read


@pytest.mark.parametrize("fn, kernels, moved, peak", [
    # select_and_scatter reads x and g, writes its result and its selection; a no-op slice copies the result.
    # Arguments live all step, the result from the slice on. Peak at the select_and_scatter: x, g, its result
    # and its selection (SELECTION / 2 = 20 M bytes), more than at the slice, where the 4 N = 16 M bytes of the
    # result take the selection's place.
    (_pool_gradient, 2, (4 * N + 4 * M + 4 * N + SELECTION) + (4 * N + 4 * N), 4 * (N + M + N) + SELECTION // 2),
    # With a ReLU, the zeros of its max and of its gradient's select are the scatter's target to CSE: stored
    # once (Z, 4N bytes, a kernel of its own) and read back by the select_and_scatter (through max(x, Z)) and
    # by the final select (compare(x, Z), the result, Z). Peak at the select_and_scatter: x, g, Z, its result
    # and its selection (the program's result, made by the final select, is not yet live).
    (_relu_pool_gradient, 3, 4 * N + (4 * N + 4 * N + 4 * M + 4 * N + SELECTION) + (4 * N * 3 + 4 * N),
     4 * (N + M + N + N) + SELECTION // 2),
])
def test_a_max_pool_gradient_runs_as_xla_expands_it(unit, fn, kernels, moved, peak):
    fast_atomics = load_hardware_text(UNIT.replace("scatter_add_rate = 1e9", "scatter_add_rate = 1e12"))
    model = _model(fn, [(8, 32, 32, 16), (8, 16, 16, 16)])
    cost = CostModel(model, fast_atomics).evaluate(model.initial())
    assert cost.kernels == kernels
    # Every kernel is memory-bound (M atomic adds take 3.3e-8 s at 1e12/s).
    assert cost.step_time_s == pytest.approx(moved / 1e12 + kernels * KERNEL + STEP)
    assert cost.peak_bytes == peak

# ---- toast cost ------------------------------------------------------------------------------------------


def test_cost_command_prints_the_breakdown_and_the_largest_buffers(tmp_path, capsys):
    from toast.cli import main

    out = tmp_path / "cost.json"
    assert main(["cost", "toast.examples.mlp:mlp", "--engine", "embedded", "--hardware", "h100",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "unsharded on mesh device=1 (h100)" in text
    for row in ("compute-bound kernels", "memory-bound kernels", "launch overhead", "exposed communication",
                "hidden communication"):
        assert row in text
    document = json.loads(out.read_text())
    assert {"step_time_s", "peak_bytes", "breakdown", "kernels", "collectives"} <= set(document)
    assert document["collectives"] == 0 and document["kernels"] == 3  # two matmuls and the fused relu
    # At the peak (the relu kernel) live: x [256,32], w1 [32,64], w2 [64,16] and the matmul's and relu's
    # outputs [256,64], all f32; largest first. The result [256,16] is made after, by the second matmul (the
    # first matmul's output dead by then: 16384 < 65536).
    assert [b["bytes"] for b in document["live_at_peak"]] == [65536, 65536, 32768, 8192, 4096]
    assert document["live_at_peak"][2]["value"] == "x"
    assert document["peak_bytes"] == 65536 * 2 + 32768 + 8192 + 4096
    from toast.output.strategy_file import schema_problem

    assert schema_problem(document, "cost") == ""  # toast/output/schemas/cost.schema.json
    assert "'microbatches' is a required property" in schema_problem(
        {k: v for k, v in document.items() if k != "microbatches"}, "cost")
    assert "is not of type 'integer'" in schema_problem({**document, "peak_bytes": 1.5}, "cost")


def test_cost_command_reports_communication_per_axis_and_level(tmp_path, capsys):
    """Megatron's MLP on 16 h100s, batch=8 over two nodes and model=2 inside one: the batch axis's
    collectives cross both levels, the model axis's stay on NVLink; the JSON has the same split."""
    from toast.cli import main

    out = tmp_path / "cost.json"
    assert main(["cost", "toast.examples.mlp:mlp", "--engine", "embedded", "--hardware", "h100", "--mesh",
                 "batch=8,model=2", "--strategy", "megatron", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "over model" in text and "(2 devices, 2 per node: nvlink)" in text and "on nvlink " in text
    document = json.loads(out.read_text())
    assert set(document["communication_by_level_s"]) == {"nvlink"}  # Megatron's MLP: all-reduces over model
    assert set(document["exposed_communication_s"]) <= set(document["communication_s"]) == {"model"}
    assert document["collectives_launched"] >= 1
    assert main(["cost", "toast.examples.mlp:mlp", "--engine", "embedded", "--hardware", "h100", "--mesh",
                 "batch=8,model=2", "--strategy", "fsdp", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(8 devices, 4 per node: nvlink+infiniband)" in text  # batch: devices 0, 2, ..., 14
    assert "nvlink+infiniband" in json.loads(out.read_text())["communication_by_level_s"]


def test_cost_command_reads_a_strategy_file_and_its_donation(tmp_path, capsys):
    from toast.cli import main

    strategy = tmp_path / "s.json"
    assert main(["shard", "toast.examples.mlp:mlp", "--engine", "embedded", "--mesh", "batch=4,model=2",
                 "--strategy", "megatron", "--hardware", "h100", "--donate", "-o", str(strategy)]) == 0
    shard_text = capsys.readouterr().out
    assert "exposed communication" in shard_text
    recorded = json.loads(strategy.read_text())
    assert recorded["donate"] == [0, 1, 2]
    out = tmp_path / "cost.json"
    assert main(["cost", "toast.examples.mlp:mlp", "--engine", "embedded", "--hardware", "h100",
                 "--strategy", str(strategy), "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["donate"] == [0, 1, 2] and document["collectives"] == 1
    assert document["step_time_s"] == pytest.approx(recorded["cost"]["step_time_s"])
    assert document["peak_bytes"] == recorded["cost"]["peak_bytes"]


def test_cost_command_names_a_missing_profile_field(tmp_path, capsys):
    from toast.cli import main

    profile = tmp_path / "partial.toml"
    profile.write_text(UNIT.replace("kernel_overhead = 1e-6\n", ""))
    assert main(["cost", "toast.examples.mlp:mlp", "--engine", "embedded", "--hardware", str(profile)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "field 'kernels.kernel_overhead'" in err[0]


def test_the_memory_timeline_peaks_where_the_cost_says():
    """``memory_timeline`` (and ``live_at_peak``) find the reductions' combining groups themselves; ``evaluate``
    takes them from the step time's. Both must give one peak, for every manual strategy of the GPT step (its
    reductions over batch and model combine)."""
    from conftest import analysis_of

    from toast import COMPOSITES, STRATEGIES, InvalidState, manual_strategy, roles_for_input

    spec = "toast.examples.gpt:gpt_small"
    model = ShardingModel(analysis_of(spec), parse_mesh("batch=2,model=4"))
    costs = CostModel(model, load_hardware("h100"))
    checked = 0
    for name in STRATEGIES + COMPOSITES:
        try:
            state, _ = manual_strategy(model, name, roles_for_input(spec))
        except InvalidState:
            continue  # megatron+sequence: both want the model axis on one dim
        assert int(costs.memory_timeline(state).max()) == costs.evaluate(state).peak_bytes, name
        checked += 1
    assert checked >= 6
