"""Collective matmul (XLA's windowed einsum, ``toast.cost.overlap``): a tensor-parallel collective hidden behind the
matmul it feeds or follows on TPU profiles, and GPU profiles unchanged.

Every expected number is worked out by hand from the ``tpu_v5p`` profile with its matmul efficiency set to 0.70 (the
profile's own is fitted to published runs, ``benchmarks/fit_tpu_kernels.py``, and may move): a bf16 matmul runs at
459e12 FLOP/s x 0.70 = 3.213e14 FLOP/s plus 10 us per call, a memory-bound kernel at 2765e9 B/s x 0.79 = 2.18435e12
B/s plus 1.7 us, 74 us per step; ICI rings at 1.8e11 B/s with 1 us per step (``toast.cost.network``): an all-gather
over n devices takes ``(n-1) * 1e-6 + (n-1)/n * S / 1.8e11`` with S the gathered bytes, an all-reduce twice that. A
collective of C seconds folded into a matmul of M seconds over n devices leaves ``C/n + (n-1)/n * max(0, C - M)``
exposed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from conftest import ONE_LEVEL, round_numbers_profile

from toast import Action, CostModel, ShardingModel, ToastError, analyze, parse_mesh
from toast.cost.hardware import known_hardware, load_hardware

MATMUL_RATE = 459e12 * 0.70  # FLOP/s: tpu_v5p's bf16 peak x matmul_efficiency
MATMUL_CALL = 10e-6  # s: tpu_v5p's matmul_overhead
STEP = 74e-6  # s: tpu_v5p's step_overhead


@pytest.fixture(scope="module")
def v5p():
    hardware = dataclasses.replace(load_hardware("tpu_v5p"), matmul_efficiency=0.70)
    # The numbers the expected values below are worked from.
    assert (hardware.peak_flops["bf16"], hardware.matmul_efficiency, hardware.matmul_overhead) == (459e12, 0.70, 10e-6)
    assert (hardware.hbm_bandwidth, hardware.hbm_efficiency, hardware.kernel_overhead) == (2765e9, 0.79, 1.7e-6)
    assert hardware.step_overhead == STEP
    ici = hardware.interconnect[0]
    assert (ici.name, ici.bandwidth, ici.latency, ici.efficiency, ici.small_latency) == ("ici", 1.8e11, 1e-6, 1.0, 1e-6)
    assert hardware.collective_matmul
    return hardware


def _model(fn, shapes, mesh):
    analysis = analyze("test", fn=fn, args=[jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes])
    return ShardingModel(analysis, parse_mesh(mesh))


def _shard(model, state, argument, dim, axis, resolution=()):
    """Shard dim ``dim`` of argument number ``argument`` (and its whole color) along ``axis``."""
    analysis = model.analysis
    name = analysis.names.def_base[analysis.program.arguments[argument]] + dim
    return model.apply(state, Action(int(analysis.color_of[name]), axis, resolution))


def _megatron_mlp(batch, hidden, mlp, mesh):
    """``(x @ w1) @ w2`` in bf16 with Megatron's sharding: the batch over ``batch``, w1 column-parallel and w2
    row-parallel over ``model`` (the mlp dim), so the second matmul's partial result is all-reduced over model."""
    model = _model(lambda x, w1, w2: (x @ w1) @ w2, [(batch, hidden), (hidden, mlp), (mlp, hidden)], mesh)
    state = _shard(model, model.initial(), 1, 1, "model")
    return model, _shard(model, state, 0, 0, "batch")


def test_row_parallel_all_reduce_hidden_behind_its_matmul(v5p):
    """The acceptance test: on mesh batch=2,model=4 each device multiplies [4096,8192]x[8192,8192] twice; the
    second's [4096,8192] bf16 partial result is all-reduced over the 4 model devices. With collective matmul the
    all-reduce runs in steps under that matmul: a quarter of it stays exposed instead of all of it."""
    model, state = _megatron_mlp(8192, 8192, 32768, "batch=2,model=4")
    cost = CostModel(model, v5p).evaluate(state)
    assert [(c.kind, c.axes, c.bytes_in) for c in cost.collectives] == [("all-reduce", ("model",), 67108864)]
    matmul = 2 * 4096 * 8192 * 8192 / MATMUL_RATE  # 1.71103584e-3 s each, compute-bound
    assert matmul == pytest.approx(1.71103584e-3)
    # 2 * (3 * 1e-6 + 3/4 * 67108864 / 1.8e11) = 5.65240533e-4 s < the matmul: only one step's share exposed.
    all_reduce = 2 * (3 * 1e-6 + 0.75 * 67108864 / 1.8e11)
    assert all_reduce == pytest.approx(5.65240533e-4)
    exposed = all_reduce / 4  # C/n + (n-1)/n * max(0, C - M), C < M
    assert cost.breakdown["exposed_communication_s"] == pytest.approx(1.41310133e-4)
    assert cost.breakdown["hidden_communication_s"] == pytest.approx(0.75 * all_reduce)
    assert cost.exposed_communication_by_axes_s == pytest.approx({"model": exposed})
    assert cost.communication_s == pytest.approx({"model": all_reduce})
    assert cost.step_time_s == pytest.approx(2 * (matmul + MATMUL_CALL) + exposed + STEP)
    assert cost.collectives_launched == 1
    # Without it (a profile with collective_matmul = false) the all-reduce runs after the matmul, all exposed.
    off = CostModel(model, dataclasses.replace(v5p, collective_matmul=False)).evaluate(state)
    assert off.breakdown["exposed_communication_s"] == pytest.approx(all_reduce)
    assert off.step_time_s == pytest.approx(2 * (matmul + MATMUL_CALL) + all_reduce + STEP)


def test_collective_matmul_exposes_what_the_communication_takes_beyond_the_matmul(v5p):
    """model=8 and an mlp dim of 8192: each device's row-parallel matmul is [4096,1024]x[1024,8192], shorter than
    the all-reduce of its [4096,8192] result over 8 devices; the 7 steps after the first each wait for the excess."""
    model, state = _megatron_mlp(8192, 8192, 8192, "batch=2,model=8")
    cost = CostModel(model, v5p).evaluate(state)
    assert [(c.kind, c.axes, c.bytes_in) for c in cost.collectives] == [("all-reduce", ("model",), 67108864)]
    matmul = 2 * 4096 * 1024 * 8192 / MATMUL_RATE  # 2.13879482e-4 s; 92274688 B / 2.18435e12 B/s = 4.2e-5 s
    assert matmul == pytest.approx(2.13879482e-4)
    all_reduce = 2 * (7 * 1e-6 + 7 / 8 * 67108864 / 1.8e11)  # 6.66447289e-4 s
    assert all_reduce == pytest.approx(6.66447289e-4)
    exposed = all_reduce / 8 + 7 / 8 * (all_reduce - matmul)  # 8.3305911e-5 + 3.95996681e-4
    assert exposed == pytest.approx(4.79302592e-4)
    assert cost.breakdown["exposed_communication_s"] == pytest.approx(exposed)
    assert cost.breakdown["hidden_communication_s"] == pytest.approx(all_reduce - exposed)
    assert cost.step_time_s == pytest.approx(2 * (matmul + MATMUL_CALL) + exposed + STEP)


def test_sequence_sharded_all_gather_hidden_behind_the_matmul_it_feeds(v5p):
    """``y @ y.T`` with y's rows over model=4 (attention's scores with the sequence sharded): y.T's use gathers
    y's [16384,8192] bf16 (Figure 5b's resolution 1), and the matmul [4096,8192]x[8192,16384] takes it in steps."""
    model = _model(lambda x, w: (lambda y: y @ y.T)(x @ w), [(16384, 8192), (8192, 8192)], "model=4")
    state = _shard(model, model.initial(), 0, 0, "model", resolution=(1,))
    cost = CostModel(model, v5p).evaluate(state)
    assert [(c.kind, c.operand, c.bytes_out) for c in cost.collectives] == [("all-gather", 0, 268435456)]
    first = 2 * 4096 * 8192 * 8192 / MATMUL_RATE  # y = x @ w: 1.71103584e-3 s
    transpose = 2 * 4096 * 8192 * 2 / (2765e9 * 0.79)  # y.T read and written: 6.14451e-5 s, memory-bound
    scores = 2 * 4096 * 8192 * 16384 / MATMUL_RATE  # 3.42207168e-3 s
    all_gather = 3 * 1e-6 + 0.75 * 268435456 / 1.8e11  # 1.12148107e-3 s < the scores' matmul
    assert (first, transpose, scores, all_gather) == pytest.approx((1.71103584e-3, 6.14451e-5, 3.42207168e-3,
                                                                    1.12148107e-3))
    exposed = all_gather / 4
    assert cost.breakdown["exposed_communication_s"] == pytest.approx(exposed)
    assert cost.breakdown["hidden_communication_s"] == pytest.approx(0.75 * all_gather)
    assert cost.step_time_s == pytest.approx(first + MATMUL_CALL + transpose + 1.7e-6 + scores + MATMUL_CALL
                                             + exposed + STEP)
    # Without: the gather starts after y and hides only behind the transpose (the scores wait for the rest).
    off = CostModel(model, dataclasses.replace(v5p, collective_matmul=False)).evaluate(state)
    assert off.breakdown["exposed_communication_s"] == pytest.approx(all_gather - transpose - 1.7e-6)


def test_an_all_reduce_the_stream_hides_stays_on_the_stream(v5p):
    """A gradient-like ``a.T @ g`` with its contracting (batch) dim over batch=2, read only at the end, then the
    Megatron MLP: the gradient's all-reduce hides behind the MLP's matmuls on the communication stream (folding it
    would expose half of it), while the MLP's all-reduce, read at once, folds into its matmul."""

    def step(a, g, x, w1, w2):
        gradient = jnp.einsum("bd,bf->df", a, g)  # one dot_general, no transpose
        return gradient, (x @ w1) @ w2

    model = _model(step, [(8192, 4096), (8192, 4096), (8192, 8192), (8192, 32768), (32768, 8192)],
                   "batch=2,model=4")
    state = _shard(model, model.initial(), 0, 0, "batch")
    state = _shard(model, state, 3, 1, "model")
    state = _shard(model, state, 2, 0, "batch")
    cost = CostModel(model, v5p).evaluate(state)
    assert sorted((c.kind, c.axes, c.bytes_in) for c in cost.collectives) == [
        ("all-reduce", ("batch",), 4096 * 4096 * 2), ("all-reduce", ("model",), 67108864)]
    gradient = 2 * 4096 * 4096 * 4096 / MATMUL_RATE  # 4.27758959e-4 s
    matmul = 2 * 4096 * 8192 * 8192 / MATMUL_RATE
    gradient_all_reduce = 2 * (1e-6 + 0.5 * 33554432 / 1.8e11)  # 1.88413511e-4 s, under the MLP's 3.4 ms
    mlp_all_reduce = 2 * (3 * 1e-6 + 0.75 * 67108864 / 1.8e11)
    assert (gradient, gradient_all_reduce) == pytest.approx((4.27758959e-4, 1.88413511e-4))
    assert cost.breakdown["exposed_communication_s"] == pytest.approx(mlp_all_reduce / 4)
    assert cost.exposed_communication_by_axes_s == pytest.approx({"batch": 0.0, "model": mlp_all_reduce / 4})
    assert cost.breakdown["hidden_communication_s"] == pytest.approx(gradient_all_reduce + 0.75 * mlp_all_reduce)
    assert cost.step_time_s == pytest.approx(gradient + 2 * matmul + 3 * MATMUL_CALL + mlp_all_reduce / 4 + STEP)


def test_scanned_tensor_parallel_layers_fold_their_all_reduce_per_iteration(v5p):
    """Four layers under ``lax.scan``, each ``tanh((h @ w1[i]) @ w2[i])`` with Megatron's sharding: the
    all-reduce of each layer's row-parallel matmul runs in the iteration (tanh reads it at once); folded into
    that matmul, each iteration exposes a quarter of it instead of all of it."""

    def layers(x, w1, w2):
        return jax.lax.scan(lambda h, w: (jnp.tanh((h @ w[0]) @ w[1]), None), x, (w1, w2))[0]

    model = _model(layers, [(8192, 8192), (4, 8192, 32768), (4, 32768, 8192)], "batch=2,model=4")
    state = _shard(model, model.initial(), 1, 2, "model")
    state = _shard(model, state, 0, 0, "batch")
    cost = CostModel(model, v5p).evaluate(state)
    assert [(c.kind, c.axes, c.bytes_in) for c in cost.collectives] == [("all-reduce", ("model",), 67108864)]
    all_reduce = 2 * (3 * 1e-6 + 0.75 * 67108864 / 1.8e11)  # per layer; each layer's matmul is 1.71 ms
    assert cost.breakdown["exposed_communication_s"] == pytest.approx(4 * all_reduce / 4)
    assert cost.breakdown["hidden_communication_s"] == pytest.approx(4 * 0.75 * all_reduce)
    off = CostModel(model, dataclasses.replace(v5p, collective_matmul=False)).evaluate(state)
    assert off.breakdown["exposed_communication_s"] == pytest.approx(4 * all_reduce)
    assert cost.step_time_s == pytest.approx(off.step_time_s - 4 * 0.75 * all_reduce)


def test_gpu_profiles_keep_collectives_on_the_stream():
    """XLA's GPU default windows no einsum (its threshold is 100000 MiB): the bundled GPU profiles say false, and
    on h100 the MLP's all-reduce (a ring over 4 NVLink GPUs: 2 * (3 * 3.4e-6 + 3/4 * S / (0.82 * 450e9)) =
    2.932003e-4 s, below NVLS's 41.5e-6 + S / (0.562 * 450e9) = 3.06857e-4 s) stays all exposed."""
    assert {name: load_hardware(name).collective_matmul for name in known_hardware()} == {
        name: name.startswith("tpu") for name in known_hardware()}
    model, state = _megatron_mlp(8192, 8192, 32768, "batch=2,model=4")
    cost = CostModel(model, load_hardware("h100")).evaluate(state)
    ring = 2 * (3 * 3.4e-6 + 0.75 * 67108864 / (0.82 * 450e9))
    assert ring == pytest.approx(2.932003e-4)
    assert cost.breakdown["exposed_communication_s"] == pytest.approx(ring)
    assert cost.breakdown["hidden_communication_s"] == 0.0


def test_collective_matmul_is_optional_and_checked(tmp_path):
    path = tmp_path / "unit.toml"
    text = round_numbers_profile("unit", ONE_LEVEL)
    path.write_text(text)
    assert load_hardware(str(path)).collective_matmul is False  # left out: off
    path.write_text(text.replace("[compiler]\n", "[compiler]\ncollective_matmul = true\n"))
    assert load_hardware(str(path)).collective_matmul is True
    path.write_text(text.replace("[compiler]\n", "[compiler]\ncollective_matmul = 1\n"))
    with pytest.raises(ToastError) as err:
        load_hardware(str(path))
    assert str(err.value) == f"{path}: field 'compiler.collective_matmul' must be true or false"


def test_a_bad_collective_matmul_is_one_line_from_the_command_line(tmp_path, capsys):
    from toast.cli import main

    path = tmp_path / "unit.toml"
    path.write_text(round_numbers_profile("unit", ONE_LEVEL).replace("[compiler]\n",
                                                                    '[compiler]\ncollective_matmul = "yes"\n'))
    assert main(["cost", "toast.examples.mlp:mlp", "--engine", "embedded", "--hardware", str(path), "--mesh",
                 "batch=2", "--strategy", "data"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"toast: error: {path}: field 'compiler.collective_matmul' must be true or false"
    assert captured.out == ""
