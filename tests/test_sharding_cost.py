"""Sharding states, predicted collectives, the cost model and the manual strategies."""

from __future__ import annotations

import functools
import json

import jax.numpy as jnp
import pytest
from conftest import analysis_of

from toast import (
    STRATEGIES,
    Action,
    CostModel,
    InvalidState,
    ShardingModel,
    ToastError,
    analyze,
    load_hardware,
    manual_strategy,
    parse_mesh,
)
from toast.cli import main
from toast.cost.collectives import CommunicationModel
from toast.examples.gpt import gpt_train_step
from toast.sharding import roles_for_input

MLP = "toast.examples.mlp:mlp"
ATTENTION = "toast.examples.attention:attention"
MLP_ROLES = roles_for_input(MLP)  # toast/examples/mlp.roles.toml
GPT_ROLES = roles_for_input("toast.examples.gpt:gpt_train_step")  # toast/examples/gpt.roles.toml


@functools.cache
def _small_gpt():
    fn, args = gpt_train_step(layers=2, batch=4, seq=16, d_model=64, heads=4, vocab=128, d_ff=256)
    return analyze("toast.examples.gpt:gpt_train_step", fn=fn, args=args)


def _mlp_model():
    analysis = analysis_of(MLP)
    return analysis, ShardingModel(analysis, parse_mesh("batch=4,model=2"))


def _names(analysis, collectives):
    return [(c.kind, c.axes, analysis.program.values[c.value].name, c.bytes_in, c.bytes_out) for c in collectives]


def test_mlp_batch_sharding_needs_no_collectives():
    analysis, model = _mlp_model()
    state, _ = manual_strategy(model, "data_parallel", MLP_ROLES)
    assert CommunicationModel(model).collectives(state) == []
    assert model.partition_spec(state, analysis.program.arguments[0]) == ("batch", None)


def test_mlp_megatron_is_one_all_reduce_over_model():
    """Figure 2c: w = all_reduce{m} of the [256/4, 16] f32 partial output: 64*16*4 bytes."""
    analysis, model = _mlp_model()
    state, actions = manual_strategy(model, "megatron", MLP_ROLES)
    assert len(actions) == 2
    assert _names(analysis, CommunicationModel(model).collectives(state)) == [
        ("all-reduce", ("model",), "result", 4096, 4096)]
    specs = [model.partition_spec(state, v) for v in analysis.program.arguments + analysis.program.results]
    assert specs == [("batch", None), (None, "model"), ("model", None), ("batch", None)]


def test_attention_sequence_resolutions():
    """Resolution 1 is Figure 5b: all_gather{s} k before the score matmul, reduce_scatter{s}
    of the output. Resolution 0 gathers qt and v instead, and all-reduces the row sums."""
    analysis = analysis_of(ATTENTION)
    model = ShardingModel(analysis, parse_mesh("s=4"))
    sequence = analysis.color_of_dim("x", 0).id
    communication = CommunicationModel(model)
    figure_5b = communication.collectives(model.apply(model.initial(), Action(sequence, "s", (1,))))
    seq_bytes = 128 * 32 * 4
    assert sorted(_names(analysis, figure_5b)) == [
        ("all-gather", ("s",), "%0", seq_bytes // 4, seq_bytes),
        ("reduce-scatter", ("s",), "result", seq_bytes, seq_bytes // 4),
    ]
    other = communication.collectives(model.apply(model.initial(), Action(sequence, "s", (0,))))
    assert sorted((c.kind, analysis.program.values[c.value].name) for c in other) == [
        ("all-gather", "%1"), ("all-gather", "%3"), ("all-reduce", "%5")]


def test_invalid_states_are_rejected():
    analysis, model = _mlp_model()
    batch, features = analysis.color_of_dim("x", 0).id, analysis.color_of_dim("x", 1).id
    state = model.apply(model.initial(), Action(batch, "batch"))
    with pytest.raises(InvalidState, match="x: one mesh axis shards two of its dims"):
        model.apply(state, Action(features, "batch"))
    odd = ShardingModel(analysis, parse_mesh("batch=3"))
    with pytest.raises(InvalidState, match=r"x\[0\] has 256 elements, not divisible by the 3 devices of batch"):
        odd.apply(odd.initial(), Action(batch, "batch"))
    with pytest.raises(ToastError, match="unknown mesh axis 'rows'"):
        model.apply(model.initial(), Action(batch, "rows"))


def test_reshape_factors_must_divide():
    """GPT heads are identified through a reshape with the 64-wide projection dim by its major
    factor (4 heads): an axis of 8 devices cannot shard them although 64 divides by 8."""
    fn, args = gpt_train_step(layers=1, batch=2, seq=16, d_model=64, heads=4, vocab=128, d_ff=256)
    analysis = analyze("gpt", fn=fn, args=args)
    model = ShardingModel(analysis, parse_mesh("model=8"))
    wq = next(v for v in analysis.program.arguments if analysis.program.values[v].name.endswith("['wq']"))
    heads = int(analysis.color_of[analysis.names.def_base[wq] + 1])
    with pytest.raises(InvalidState, match="has 4 elements, not divisible by the 8 devices of model"):
        model.apply(model.initial(), Action(heads, "model"))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gpt_manual_strategies_are_valid(strategy):
    analysis = _small_gpt()
    model = ShardingModel(analysis, parse_mesh("batch=2,model=2"))
    state, actions = manual_strategy(model, strategy, GPT_ROLES)
    assert model.problem(state) == ""
    kinds = {(c.kind, c.axes) for c in CommunicationModel(model).collectives(state)}
    assert ("all-reduce", ("batch",)) in kinds or ("all-reduce", ("batch", "model")) in kinds  # gradients
    program = analysis.program
    spec_of = {program.values[v].name: model.partition_spec(state, v) for v in program.arguments}
    assert spec_of["tokens"][0] == "batch"
    if strategy == "megatron":
        assert spec_of["params['blocks'][0]['w_fc']"] == (None, "model")
        assert ("all-reduce", ("model",)) in kinds
    if strategy == "fsdp":
        assert spec_of["params['blocks'][0]['w_fc']"] == (None, "batch")  # stored sharded ...
        assert ("all-gather", ("batch",)) in kinds  # ... gathered where used
    if strategy == "sequence":
        assert spec_of["tokens"] == ("batch", "model")
        assert ("reduce-scatter", ("model",)) in kinds


@pytest.mark.parametrize("mesh, strategy, expected", [
    # w_fc is [D=64, F=256]: Megatron splits F on model, then FSDP stores it split on its largest dim still
    # whole (D) along batch; wte [V=128, D=64] only by FSDP, on V.
    ("batch=2,model=2", "fsdp+megatron", {"w_fc": ("batch", "model"), "wte": ("batch", None),
                                           "tokens": ("batch", None)}),
    ("batch=2,model=2", "fsdp+sequence", {"w_fc": (None, "batch"), "wte": ("batch", None),
                                           "tokens": ("batch", "model")}),
    # Three axes: Megatron on model, the sequence on seq (the sequence strategy prefers an axis named so).
    ("batch=2,seq=2,model=2", "megatron+sequence", {"w_fc": (None, "model"), "wte": (None, None),
                                                     "tokens": ("batch", "seq")}),
    ("batch=2,seq=2,model=2", "sequence+megatron+fsdp", {"w_fc": ("batch", "model"), "wte": ("batch", None),
                                                          "tokens": ("batch", "seq")}),
])
def test_composite_strategies(mesh, strategy, expected):
    """The paper's manual baselines combine FSDP, Megatron and sequence parallelism; the parts may come in
    any order."""
    analysis = _small_gpt()
    model = ShardingModel(analysis, parse_mesh(mesh))
    state, _ = manual_strategy(model, strategy, GPT_ROLES)
    assert model.problem(state) == ""
    program = analysis.program
    spec_of = {program.values[v].name: model.partition_spec(state, v) for v in program.arguments}
    names = {"w_fc": "params['blocks'][1]['w_fc']", "wte": "params['wte']", "tokens": "tokens"}
    assert {key: spec_of[names[key]] for key in expected} == expected


def test_composite_strategy_errors():
    model = ShardingModel(analysis_of(MLP), parse_mesh("batch=4"))
    with pytest.raises(ToastError, match="unknown strategy 'fsdp\\+data_parallel'.*combine fsdp, megatron and"):
        manual_strategy(model, "fsdp+data_parallel", MLP_ROLES)
    with pytest.raises(ToastError, match="unknown strategy 'fsdp\\+fsdp'"):
        manual_strategy(model, "fsdp+fsdp", MLP_ROLES)
    with pytest.raises(ToastError, match="strategy 'fsdp\\+megatron' needs a mesh with two axes"):
        manual_strategy(model, "fsdp+megatron", MLP_ROLES)


def test_hardware_changes_the_step_time_as_datasheets_say():
    """The same Megatron strategy of a bf16 GPT-2-small-sized step (2 layers): TPU v3 (123
    TFLOP/s bf16) slower than A100 (312) slower than H100 (989, faster NVLink)."""
    fn, args = gpt_train_step(layers=2, dtype=jnp.bfloat16)
    analysis = analyze("toast.examples.gpt:gpt_train_step", fn=fn, args=args)
    model = ShardingModel(analysis, parse_mesh("batch=4,model=2"))
    state, _ = manual_strategy(model, "megatron", GPT_ROLES)
    times = {name: CostModel(model, load_hardware(name)).evaluate(state).step_time_s
             for name in ("tpu_v3", "a100_80gb", "h100")}
    assert times["tpu_v3"] > times["a100_80gb"] > times["h100"]


def test_cost_is_relative_to_the_unsharded_program():
    analysis, model = _mlp_model()
    costs = CostModel(model, load_hardware("a100_80gb"))
    assert costs.evaluate(model.initial()).relative == pytest.approx(1.0)
    state, _ = manual_strategy(model, "data_parallel", MLP_ROLES)
    sharded = costs.evaluate(state)
    # Data parallelism over 4 devices: each device's matmuls do a quarter of the FLOPs.
    assert costs.kernel_work(state)[0].sum() == pytest.approx(costs.kernel_work(model.initial())[0].sum() / 4)
    assert sharded.peak_bytes < costs.evaluate(model.initial()).peak_bytes
    # Over the device memory, the penalty applies: C(s) = RT + C * (peak - DM) / initial peak.
    tight = CostModel(model, load_hardware("a100_80gb"), memory_penalty=2.0, device_memory=1000)
    initial_peak = tight.evaluate(model.initial()).peak_bytes
    cost = tight.evaluate(state)
    runtime_ratio = cost.step_time_s / tight.evaluate(model.initial()).step_time_s
    assert cost.relative == pytest.approx(runtime_ratio + 2.0 * (cost.peak_bytes - 1000) / initial_peak)


def test_shard_command_writes_a_strategy(tmp_path, capsys):
    out = tmp_path / "strategy.json"
    assert main(["shard", MLP, "--engine", "embedded", "--mesh", "batch=4,model=2", "--strategy", "megatron",
                 "--hardware", "h100", "-o", str(out)]) == 0
    assert "1 all-reduce over model" in capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document["mesh"] == {"axes": [["batch", 4], ["model", 2]]} and document["hardware"] == "h100"
    assert [a["partition_spec"] for a in document["arguments"]] == [["batch", None], [None, "model"], ["model", None]]
    assert [(c["kind"], c["axes"], c["bytes_in"]) for c in document["collectives"]] == [("all-reduce", ["model"], 4096)]
    assert set(document["cost"]) == {"step_time_s", "peak_bytes", "breakdown", "kernels", "collectives",
                                     "collectives_launched", "communication_s", "exposed_communication_s",
                                     "communication_by_level_s", "relative"}
    assert document["cost"]["communication_by_level_s"].keys() == {"nvlink"}


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "batch=3,model=2"], "x[0] has 256 elements, not divisible by the 3 devices of batch"),
    (["--mesh", "batch=4", "--hardware", "tpu_v9"], "unknown hardware 'tpu_v9' (known: a100_40gb, a100_80gb"),
    (["--mesh", "batch=4:2"], "--mesh batch=4:2: expected NAME=SIZE"),
    (["--mesh", "batch=4", "--strategy", "megatron"], "strategy 'megatron' needs a mesh with two axes"),
])
def test_shard_bad_input(argv, message, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["shard", MLP, "--engine", "embedded", "-o", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()
