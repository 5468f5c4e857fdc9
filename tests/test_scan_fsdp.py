"""FSDP on layers under ``jax.lax.scan``, as XLA's SPMD partitioner runs it (issue 37, item 1).

The stacked parameters stay split in the loops' carries; each iteration gathers its layer's slice (forward and
backward) and reduce-scatters its layer's gradient into the split accumulator; the gathers are prefetched and the
reductions deferred by a step of the loop (``toast.cost.loops``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toast import CostModel, Roles, ShardingModel, analyze, load_hardware, manual_strategy, parse_mesh
from toast.xla.validate import validate

LAYERS, WIDTH, BATCH = 4, 256, 64


def _scanned_step():
    """``w: [L, D, D]`` stacked, ``x: [B, D]``; a tanh MLP over the layers under scan; SGD returns the new
    stack. The gradient of each layer is ``h_i^T @ dy_i`` summed over the batch: a partial sum when the batch is
    split."""
    def loss(w, x):
        def layer(h, wi):
            return jnp.tanh(h @ wi), None
        h, _ = jax.lax.scan(layer, x, w)
        return (h * h).mean()

    def step(w, x):
        return w - 0.1 * jax.grad(loss)(w, x)

    w = jnp.zeros((LAYERS, WIDTH, WIDTH), jnp.float32) + 0.01
    x = jnp.ones((BATCH, WIDTH), jnp.float32)
    return step, (w, x)


@pytest.fixture(scope="module")
def fsdp():
    fn, args = _scanned_step()
    analysis = analyze("scanned", fn=fn, args=args)
    model = ShardingModel(analysis, parse_mesh("batch=8"))
    state, _ = manual_strategy(model, "fsdp", Roles({"batch": [("x", 0)]}))
    return model, state


def _loop_ops(model):
    plan = CostModel(model, load_hardware("h100"))
    return plan, {int(op) for op in np.flatnonzero(plan.op_in_loop)}


def test_each_iteration_gathers_its_slice_and_reduce_scatters_its_gradient(fsdp):
    """Hand-worked: one layer's slice is D x D f32 = 256 KiB whole, 32 KiB per device on 8; the stack
    (L x 256 KiB = 1 MiB) is never gathered whole. Forward and backward loop each gather the slice once per
    iteration; the backward loop reduce-scatters the layer's gradient (256 KiB in, 32 KiB out)."""
    model, state = fsdp
    cost_model, loop_ops = _loop_ops(model)
    cost = cost_model.evaluate(state)
    slice_bytes, shard = WIDTH * WIDTH * 4, WIDTH * WIDTH * 4 // 8
    in_loop = [c for c in cost.collectives if c.op in loop_ops]
    gathers = [c for c in in_loop if c.kind == "all-gather"]
    scatters = [c for c in in_loop if c.kind == "reduce-scatter"]
    assert [(c.bytes_in, c.bytes_out) for c in gathers] == [(shard, slice_bytes)] * 2
    assert [(c.bytes_in, c.bytes_out) for c in scatters] == [(slice_bytes, shard)]
    whole_stack = LAYERS * slice_bytes
    assert not [c for c in cost.collectives if c.bytes_out >= whole_stack or c.bytes_in >= whole_stack]


def test_the_loops_carry_the_stack_split(fsdp):
    """The while loops' operands holding the stack are split 8 ways on the stored dim (not gathered before the
    loop): the peak holds 1/8 of the stack, the new stack and the gradient accumulator."""
    model, state = fsdp
    analysis = model.analysis
    program = analysis.program
    masks = []
    for op in program.ops:
        if op.kind == "stablehlo.while":
            for index, operand in enumerate(op.operands):
                if program.values[operand].shape == (LAYERS, WIDTH, WIDTH):
                    first = analysis.names.use_name(op.id, index, 0)
                    masks.append(tuple(int(state.masks[first + d]) for d in range(3)))
    assert masks and all(sorted(m) == [0, 0, 1] for m in masks), masks


def test_per_iteration_collectives_agree_with_xla(fsdp):
    """XLA compiles the written module on 8 host devices: the same gathers per loop body, and the gradient
    reduction per loop body (XLA's CPU pipeline writes all-reduce + dynamic-slice for the reduce-scatter the
    GPU and TPU pipelines form: compared in its CPU form); the peak within 25% of XLA's live peak."""
    model, state = fsdp
    agreement = validate(model, state, load_hardware("h100"))
    assert agreement.numerics.match, agreement.numerics
    loop_rows = {(r.kind, r.axes): (r.predicted, r.xla, r.matched) for r in agreement.rows if r.in_loop}
    assert loop_rows == {("all-gather", ("batch",)): (2, 2, 2), ("all-reduce", ("batch",)): (1, 1, 1)}
    assert agreement.agreement == 1.0, agreement.rows
    assert abs(agreement.peak_error) <= 0.25, (agreement.predicted_peak_bytes, agreement.xla_peak_bytes)


def test_prefetched_gathers_hide_behind_the_layers(fsdp):
    """Each layer's gather is prefetched under the previous layer and the gradient's reduce-scatter finishes
    under the next: with compute far longer than the collectives (the matmuls at 1e-4 of peak), only the first
    gather of each loop and the last reduce-scatter wait, once each (the step has no other collective);
    without overlap every iteration's do, L = 4 times as much."""
    model, state = fsdp
    slow = dataclasses.replace(load_hardware("h100"), matmul_efficiency=1e-4)
    cost_model = CostModel(model, slow)
    _, loop_ops = _loop_ops(model)
    cost = cost_model.evaluate(state)
    assert {c.op for c in cost.collectives} <= loop_ops
    once = sum(cost_model.collective_time(c) for c in cost.collectives)
    assert cost.breakdown["exposed_communication_s"] == pytest.approx(once, rel=1e-9)
    assert cost.breakdown["hidden_communication_s"] == pytest.approx((LAYERS - 1) * once, rel=1e-9)
    serial = CostModel(model, slow, overlap=False).evaluate(state)
    assert serial.breakdown["exposed_communication_s"] == pytest.approx(LAYERS * once, rel=1e-9)


def test_gathers_longer_than_the_layers_set_the_iteration(fsdp):
    """With collectives far longer than compute (a 1000x slower link), an iteration takes its collectives back
    to back: the loops' exposed time is every iteration's collectives less the compute they hide, plus the first
    gather and last reduce-scatter once: exposed + compute in the loops = (L + 1) x the collectives, to within
    the compute (here under 1% of them)."""
    model, state = fsdp
    hardware = load_hardware("h100")
    slow_link = dataclasses.replace(hardware, interconnect=tuple(
        dataclasses.replace(level, bandwidth=level.bandwidth / 1000) for level in hardware.interconnect))
    cost_model = CostModel(model, slow_link)
    cost = cost_model.evaluate(state)
    once = sum(cost_model.collective_time(c) for c in cost.collectives)
    exposed = cost.breakdown["exposed_communication_s"]
    assert (LAYERS + 1) * once * 0.99 <= exposed + cost.compute_s and exposed <= (LAYERS + 1) * once


def test_a_reduction_into_the_residual_stream_is_not_deferred():
    """A tensor-parallel layer under scan, ``h + tanh(h @ a) @ b`` with ``b`` row-parallel: the all-reduce of the
    second matmul's partial sum is added to the carried residual stream, which the next iteration reads at once,
    so XLA cannot finish it under the next layer: every iteration waits for it (it was priced as deferred: once
    per loop). On a GPU profile (no collective matmul) with nothing to hide it behind, the loop's exposed time is
    L times the all-reduce, less the one kernel between it and its reader (under 10%)."""
    def step(x, a, b):
        def layer(h, w):
            return h + jnp.tanh(h @ w[0]) @ w[1], None
        return jax.lax.scan(layer, x, (a, b))[0]

    args = (jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32),
            jax.ShapeDtypeStruct((LAYERS, WIDTH, 4 * WIDTH), jnp.float32),
            jax.ShapeDtypeStruct((LAYERS, 4 * WIDTH, WIDTH), jnp.float32))
    model = ShardingModel(analyze("tensor_parallel_scan", fn=step, args=args), parse_mesh("batch=2,model=4"))
    state, _ = manual_strategy(model, "megatron", Roles({"batch": [("x", 0)], "mlp": [("a", 2)]}))
    cost_model = CostModel(model, load_hardware("h100"))
    cost = cost_model.evaluate(state)
    [reduction] = [c for c in cost.collectives if c.kind == "all-reduce"]
    assert reduction.bytes_in == BATCH // 2 * WIDTH * 4  # the batch split 2 ways: [32, 256] f32
    every_layer = LAYERS * cost_model.collective_time(reduction)
    assert 0.9 * every_layer <= cost.breakdown["exposed_communication_s"] <= every_layer * (1 + 1e-9)
