"""Memory kinds: values placed in host memory take no device memory; their copies run on the host link.

Programs are lowered for TPU: JAX's CPU lowering drops the placement annotations (CPU has no host memory kind),
TPU's and GPU's keep them as ``annotate_device_placement`` custom calls. Every expected number is worked out by
hand from the profile ``HOSTED``: conftest's round numbers (1e12 FLOP/s, 1e12 B/s of HBM, 1 us per kernel, 10 us
per step) and a host link of 1e9 B/s one way.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import ONE_LEVEL, round_numbers_profile
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import SingleDeviceSharding

from toast import Action, CostModel, ShardingModel, analyze, parse_mesh
from toast.cost.hardware import load_hardware
from toast.frontend.stablehlo import read_text

HOST_LINK = 1e9  # bytes/s one way
HOSTED = round_numbers_profile("hosted", f'[host]\nbandwidth = {HOST_LINK:g}\nsources = ["round numbers"]\n'
                               + ONE_LEVEL)
M = 512 * 512 * 4  # bytes of an f32[512,512]
MATMUL = 2 * 512**3 / 1e12 + 1e-6  # one [512,512]x[512,512] f32 matmul on HOSTED: FLOP-bound, plus its overhead
STEP = 1e-5
HOST, DEVICE = jax.memory.Space.Host, jax.memory.Space.Device


def _profile(text=HOSTED):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hosted.toml"
        path.write_text(text)
        return load_hardware(str(path))


def _tpu_text(fn, *args, **jit):
    return jax.jit(fn, **jit).trace(*args).lower(lowering_platforms=("tpu",)).as_text(debug_info=True)


@functools.cache
def _model(text, mesh="d=1"):
    return ShardingModel(analyze(read_text(text, source="test"), engine="embedded"), parse_mesh(mesh))


@functools.cache
def _chain_text(offload, barrier=True):
    return _tpu_text(_chain(offload, barrier), F32_512, F32_512)


def _chain(offload, barrier=True):
    """Four matmuls; the first's result ``a`` is read by the second and, at the end, by a reduction with the
    fourth's: kept on the device in between, or (``offload``) put in host memory and fetched back for the end,
    after an optimization barrier with the fourth's result, as remat's backward pass reads its residuals (without
    one XLA drops a copy straight back: no copy at all)."""
    def chain(x, w):
        a = x @ w                                            # kernel 0
        kept = jax.device_put(a, HOST) if offload else a
        b = a @ w                                            # kernel 1
        c = b @ w                                            # kernel 2
        d = c @ w                                            # kernel 3
        if barrier:
            kept, d = jax.lax.optimization_barrier((kept, d))
        back = jax.device_put(kept, DEVICE) if offload else kept
        return jnp.sum(back * d)                             # kernel 4: the multiply fuses into the reduction
    return chain


F32_512 = jax.ShapeDtypeStruct((512, 512), jnp.float32)


def test_an_offloaded_activation_is_not_counted_in_the_peak():
    hosted = _profile()
    kept, offloaded = (_model(_chain_text(offload)) for offload in (False, True))
    kept_cost = CostModel(kept, hosted).evaluate(kept.initial())
    cost = CostModel(offloaded, hosted).evaluate(offloaded.initial())
    # Kept: x and w (2M) for the step; a from kernel 0 to 4, b 1-2, c 2-3, d 3-4, the result from 4. During
    # kernel 2: x, w, a, b, c = 5M (kernel 3: x, w, a, c, d, also 5M).
    assert kept_cost.peak_bytes == 5 * M
    # Offloaded: a dies after kernel 1, its last reader on the device; its copy back lives during kernel 4 only.
    # Kernels 1, 2, 3: x, w and two of a, b, c, d = 4M; kernel 4: x, w, the copy, d and the f32 result: 4M + 4.
    assert cost.peak_bytes == 4 * M + 4
    assert kept_cost.breakdown["exposed_host_transfer_s"] == kept_cost.breakdown["hidden_host_transfer_s"] == 0.0


def test_the_copies_are_priced_on_the_host_link_and_the_reader_waits_for_the_fetch():
    hosted = _profile()
    kept, offloaded = (_model(_chain_text(offload)) for offload in (False, True))
    kept_cost = CostModel(kept, hosted).evaluate(kept.initial())
    cost = CostModel(offloaded, hosted).evaluate(offloaded.initial())
    # Four matmuls, then the reduction: memory-bound, reading a (or its copy) and d, writing 4 bytes.
    assert kept_cost.step_time_s == pytest.approx(4 * MATMUL + (2 * M + 4) / 1e12 + 1e-6 + STEP)
    copy = M / HOST_LINK  # 1.048576e-3 s each way
    # The offload runs from the end of kernel 0 (MATMUL) to MATMUL + copy. The fetch comes after kernel 3 (4 MATMUL:
    # its barrier waits for d) but reads what the offload wrote, so it starts at MATMUL + copy, the later, and ends
    # at MATMUL + 2 copy; the reduction was due at 4 MATMUL and waits the difference.
    exposed = 2 * copy - 3 * MATMUL
    assert exposed == pytest.approx(1.288845632e-3)
    assert cost.breakdown["exposed_host_transfer_s"] == pytest.approx(exposed)
    assert cost.breakdown["hidden_host_transfer_s"] == pytest.approx(2 * copy - exposed)
    assert cost.step_time_s == pytest.approx(kept_cost.step_time_s + exposed)


def test_a_fast_host_link_hides_the_offload_but_not_a_fetch_its_reader_follows():
    fast = _profile(HOSTED.replace(f"bandwidth = {HOST_LINK:g}", "bandwidth = 1e+11"))
    offloaded = _model(_chain_text(True))
    cost = CostModel(offloaded, fast).evaluate(offloaded.initial())
    copy = M / 1e11  # 1.048576e-5 s
    # The offload ends during kernel 1; the fetch starts after kernel 3 and kernel 4, its reader, waits for all of it.
    assert cost.breakdown["exposed_host_transfer_s"] == pytest.approx(copy)
    assert cost.breakdown["hidden_host_transfer_s"] == pytest.approx(copy)
    assert cost.step_time_s == pytest.approx(4 * MATMUL + copy + (2 * M + 4) / 1e12 + 1e-6 + STEP)
    serial = CostModel(offloaded, fast, overlap=False).evaluate(offloaded.initial())
    assert serial.breakdown["exposed_host_transfer_s"] == pytest.approx(2 * copy)
    assert serial.step_time_s == pytest.approx(cost.step_time_s + copy)


def test_a_copy_straight_back_is_no_copy():
    """Without the barrier the fetch reads the offload's result itself: XLA drops the pair (measured on an H100,
    benchmarks/gpu_host_offload.py), and the program costs what it costs kept on the device."""
    hosted = _profile()
    round_trip = _model(_chain_text(True, barrier=False))
    cost = CostModel(round_trip, hosted).evaluate(round_trip.initial())
    assert cost.peak_bytes == 5 * M
    assert cost.breakdown["exposed_host_transfer_s"] == cost.breakdown["hidden_host_transfer_s"] == 0.0
    assert cost.step_time_s == pytest.approx(4 * MATMUL + (2 * M + 4) / 1e12 + 1e-6 + STEP)


def test_a_sharded_offload_moves_each_devices_shard():
    offloaded = _model(_chain_text(True), mesh="batch=2")
    analysis = offloaded.analysis
    rows = analysis.names.def_base[analysis.program.arguments[0]] + 0  # x's rows, and a's, b's, ... with them
    state = offloaded.apply(offloaded.initial(), Action(int(analysis.color_of[rows]), "batch"))
    cost = CostModel(offloaded, _profile()).evaluate(state)
    # Each device offloads and fetches its [256,512] half of a: M/2 bytes each way.
    moved = cost.breakdown["exposed_host_transfer_s"] + cost.breakdown["hidden_host_transfer_s"]
    assert moved == pytest.approx(2 * (M / 2) / HOST_LINK)


def _scanned_step(ws, x):
    """MaxText's offloading: a scan over layers whose remat policy offloads each layer's ``q`` to host memory."""
    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["q"], offload_src="device",
        offload_dst="pinned_host")

    def layer(h, w):
        q = checkpoint_name(h @ w, "q")
        return h + jnp.sin(q), None

    def loss(ws, x):
        h, _ = jax.lax.scan(jax.checkpoint(layer, policy=policy), x, ws)
        return jnp.sum(h)

    return jax.grad(loss)(ws, x)


def test_a_scans_offloaded_residuals_leave_the_device():
    layers, q_bytes = 4, 128 * 256 * 4
    text = _tpu_text(_scanned_step, jax.ShapeDtypeStruct((layers, 256, 256), jnp.float32),
                     jax.ShapeDtypeStruct((128, 256), jnp.float32))
    assert text.count('_xla_buffer_placement = "pinned_host"') == 1  # one offload, in the forward loop's body
    # The same program without the offload: its placements made no-ops (into the memory the value is in already).
    kept_text = text.replace('_xla_buffer_placement = "pinned_host"', '_xla_buffer_placement = "device"')
    hosted = _profile()
    offloaded, kept = _model(text), _model(kept_text)
    costs, kept_costs = CostModel(offloaded, hosted), CostModel(kept, hosted)
    cost, kept_cost = costs.evaluate(offloaded.initial()), kept_costs.evaluate(kept.initial())
    # The scan stacks each layer's q, f32[4,128,256], for the backward loop; offloaded, the whole stack lies on the
    # host (XLA's host offloader allocates it there), so the peak, in the backward loop where both programs hold
    # the same buffers otherwise, drops by the stack's bytes.
    assert kept_cost.peak_bytes - cost.peak_bytes == layers * q_bytes
    stacks = [b for b in costs.live_at_peak(offloaded.initial(), top=50) if b.shape == (layers, 128, 256)]
    kept_stacks = [b for b in kept_costs.live_at_peak(kept.initial(), top=50) if b.shape == (layers, 128, 256)]
    assert (len(stacks), len(kept_stacks)) == (1, 2)  # the layers' inputs h stay: a scan saves its carries
    # Four offloads of q in the forward loop, four fetches in the backward loop.
    moved = cost.breakdown["exposed_host_transfer_s"] + cost.breakdown["hidden_host_transfer_s"]
    assert moved == pytest.approx(2 * layers * q_bytes / HOST_LINK)
    assert kept_cost.breakdown["hidden_host_transfer_s"] == 0.0


def test_the_frontend_reads_placements_and_host_arguments():
    device = SingleDeviceSharding(jax.devices()[0])
    pinned = device.with_memory_kind("pinned_host")

    def f(x, y):
        z = jax.device_put(jnp.sin(y), HOST)
        return jax.device_put(x, DEVICE) * 2 + jax.device_put(z, DEVICE)

    b = jax.ShapeDtypeStruct((128, 256), jnp.float32, sharding=pinned)
    text = _tpu_text(f, b, jax.ShapeDtypeStruct((128, 256), jnp.float32), in_shardings=(pinned, None))
    program = read_text(text, source="test")
    x, y = (program.values[v] for v in program.arguments)
    assert (x.memory_kind, y.memory_kind) == ("pinned_host", "")
    placed = [program.values[op.results[0]].memory_kind for op in program.ops if op.kind == "stablehlo.custom_call"]
    assert placed == ["pinned_host", "device", "device"]  # z to the host; x and z back
    # XLA's own spelling of a placement: the target names the memory.
    moved = read_text('func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n'
                      '  %0 = stablehlo.custom_call @MoveToHost(%x) : (tensor<4xf32>) -> tensor<4xf32>\n'
                      '  %1 = stablehlo.custom_call @MoveToDevice(%0) : (tensor<4xf32>) -> tensor<4xf32>\n'
                      '  return %1 : tensor<4xf32>\n}\n')
    assert [moved.values[op.results[0]].memory_kind for op in moved.ops[:2]] == ["pinned_host", "device"]


def test_an_argument_in_host_memory_takes_no_device_memory():
    pinned = SingleDeviceSharding(jax.devices()[0]).with_memory_kind("pinned_host")

    def f(x, y):
        return jax.device_put(x, DEVICE) * 2 + y

    b = 128 * 256 * 4
    shape = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    hosted = _profile()
    on_host = _model(_tpu_text(f, jax.ShapeDtypeStruct((128, 256), jnp.float32, sharding=pinned), shape,
                               in_shardings=(pinned, None)))
    on_device = _model(_tpu_text(lambda x, y: x * 2 + y, shape, shape))
    timeline = CostModel(on_host, hosted).memory_timeline(on_host.initial())
    # Before the one kernel only y is on the device; during it, y, x's copy and the result.
    assert list(timeline[:2]) == [b, 3 * b]
    assert list(CostModel(on_device, hosted).memory_timeline(on_device.initial())[:2]) == [2 * b, 3 * b]
    cost = CostModel(on_host, hosted).evaluate(on_host.initial())
    # The kernel reading x's copy is the first: nothing runs while it is fetched, and the step waits for it all.
    assert (cost.breakdown["exposed_host_transfer_s"], cost.breakdown["hidden_host_transfer_s"]) == (
        pytest.approx(b / HOST_LINK), 0.0)
    assert cost.step_time_s == pytest.approx(b / HOST_LINK + 3 * b / 1e12 + 1e-6 + STEP)


def test_cost_command_reports_the_host_transfers(tmp_path, capsys):
    from toast.cli import main

    program = tmp_path / "chain.mlir"
    program.write_text(_chain_text(True))
    profile = tmp_path / "hosted.toml"
    profile.write_text(HOSTED)
    out = tmp_path / "cost.json"
    assert main(["cost", str(program), "--engine", "embedded", "--hardware", str(profile), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "exposed host transfers" in text and "hidden host transfers" in text
    document = json.loads(out.read_text())
    assert document["breakdown"]["exposed_host_transfer_s"] == pytest.approx(2 * M / HOST_LINK - 3 * MATMUL)
    assert document["peak_bytes"] == 4 * M + 4
    from toast.output.strategy_file import schema_problem

    assert schema_problem(document, "cost") == ""
