"""The XLA check (``toast.xla.worker``): XLA's SPMD partitioner on host CPU devices.

Worker-backed tests lower the two-layer MLP of ``toast.examples.mlp`` with JAX's own sharding
annotations (one worker call per lowering, cached per module) and check the text in a second
worker of 8 host devices; the parsers and the output comparison are tested in-process.
"""

from __future__ import annotations

import functools
import re

import jax
import numpy as np
import pytest

from toast.errors import ToastError
from toast.examples.mlp import mlp
from toast.xla.groups import group_axes, parse_groups
from toast.xla.hlo_text import HloShape, parse_instruction
from toast.xla.numerics import compare_outputs
from toast.xla.worker import (
    _strip_shardings,
    check_sharded_module,
    lower_sharded,
)

MESH = [("batch", 4), ("model", 2)]
BATCH_ONLY = ([["batch", None], [None, None], [None, None]], [["batch", None]])
MEGATRON = ([["batch", None], [None, "model"], ["model", None]], [["batch", None]])
SHARD_BYTES = 256 // 4 * 16 * 4  # one [64, 16] f32 shard of the output


def mlp_constrained():
    """The MLP with its hidden activation constrained to [batch, model] (a factory for the worker)."""
    _, args = mlp()

    def constrained(x, w1, w2):
        y = jax.lax.with_sharding_constraint(x @ w1, jax.sharding.PartitionSpec("batch", "model"))
        return jax.nn.relu(y) @ w2

    return constrained, args


def _lowered(source: str, specs: tuple, shardy: bool | None = None) -> str:
    """JAX's annotated text for ``source`` on ``MESH`` (one worker call per distinct request)."""
    frozen = tuple(tuple(tuple(spec) for spec in group) for group in specs)
    return _lowered_once(source, frozen, shardy)


@functools.cache
def _lowered_once(source: str, specs: tuple, shardy: bool | None) -> str:
    in_specs, out_specs = ([list(spec) for spec in group] for group in specs)
    return lower_sharded(source, MESH, in_specs=in_specs, out_specs=out_specs, shardy=shardy, timeout_s=300)


def test_batch_sharding_matches_without_collectives():
    text = _lowered("toast.examples.mlp:mlp", BATCH_ONLY)
    assert '#sdy.sharding<@mesh, [{"batch"}, {}]>' in text
    report = check_sharded_module(text, MESH, timeout_s=300)
    assert report.numerics.match and report.numerics.outputs == 1
    assert report.numerics.max_abs_error < 1e-5
    assert report.collectives == ()
    assert report.memory["argument_size_in_bytes"] > 0
    assert [stage for stage, _ in report.worker_peaks] == [
        "reading the module", "compiling the reference", "running the reference", "compiling the sharded module",
        "running the sharded module", "comparing the outputs"]
    assert all(peak > 50 << 20 for _, peak in report.worker_peaks)  # JAX alone takes more


def test_megatron_gives_one_all_reduce_over_model():
    text = _lowered("toast.examples.mlp:mlp", MEGATRON)
    report = check_sharded_module(text, MESH, seed=1, timeout_s=300)
    assert report.numerics.match
    [collective] = report.collectives
    assert collective.kind == "all-reduce"
    assert collective.axes == ("model",)
    assert collective.groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert (collective.dtype, collective.shape) == ("f32", (64, 16))
    assert collective.bytes_in == collective.bytes_out == SHARD_BYTES
    assert report.memory["argument_size_in_bytes"] > 0
    assert report.memory["output_size_in_bytes"] == SHARD_BYTES


def test_shardy_constraint_on_an_intermediate():
    text = _lowered("tests.test_xla_check:mlp_constrained", BATCH_ONLY)
    assert 'sdy.sharding_constraint %0 <@mesh, [{"batch"}, {"model"}]>' in text
    report = check_sharded_module(text, MESH, timeout_s=300)
    assert report.numerics.match
    assert [(c.kind, c.axes, c.bytes_out) for c in report.collectives] == [("all-reduce", ("model",), SHARD_BYTES)]


def test_gspmd_form_with_constraint():
    text = _lowered("tests.test_xla_check:mlp_constrained", MEGATRON, shardy=False)
    assert 'mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"' in text
    assert 'stablehlo.custom_call @Sharding(%0) {backend_config = "", mhlo.sharding = "{devices=[4,2]<=[8]}"}' in text
    report = check_sharded_module(text, MESH, timeout_s=300)
    assert report.numerics.match
    assert [(c.kind, c.axes, c.bytes_out) for c in report.collectives] == [("all-reduce", ("model",), SHARD_BYTES)]


def test_mesh_that_does_not_fit_the_module_is_one_line_error():
    text = _lowered("toast.examples.mlp:mlp", MEGATRON)
    expected = r"^XLA check worker failed: the module is partitioned for 8 devices, the mesh has 4$"
    with pytest.raises(ToastError, match=expected):
        check_sharded_module(text, [("batch", 2), ("model", 2)], timeout_s=300)


# ---- in-process: parsers and comparison ------------------------------------------------


def test_parse_groups_explicit_empty_and_iota():
    assert parse_groups("{{0,2},{1,3}}", 4) == ((0, 2), (1, 3))
    assert parse_groups("{}", 4) == ((0, 1, 2, 3),)
    assert parse_groups("[4,2]<=[8]", 8) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert parse_groups("[2,4]<=[4,2]T(1,0)", 8) == ((0, 2, 4, 6), (1, 3, 5, 7))


def test_parse_groups_mesh_axes_form():
    # XLA's own mesh (axis_0/1/2), iota or with device_ids, and Shardy sub-axes.
    assert parse_groups("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_0'}", 8) == ((0, 2, 4, 6), (1, 3, 5, 7))
    with_ids = "mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_0'}"
    assert parse_groups(with_ids, 8) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert parse_groups("mesh['a'=8] {'a':(1)2}", 8) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert parse_groups("mesh['a'=8] {'a':(2)2}", 8) == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert parse_groups("mesh['a'=4,'b'=2] {}", 8) == tuple((i,) for i in range(8))
    line = ("%all-gather = f32[32,64]{1,0} all-gather(%param.1), channel_id=2, replica_groups=mesh['axis_0'=2,"
            "'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_0'}, dimensions={0}, use_global_device_ids=true")
    attributes = parse_instruction(line).attributes
    assert attributes["replica_groups"] + ", device_ids=" + attributes["device_ids"] == with_ids


def test_strip_shardings_leaves_a_one_device_module():
    from jax.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    text = _lowered("tests.test_xla_check:mlp_constrained", MEGATRON)
    context = jax_mlir.make_ir_context()
    with context:
        stripped = _strip_shardings(ir.Module.parse(text))
    assert "sdy" not in stripped and "mhlo.sharding" not in stripped
    assert "mhlo.num_partitions = 1 : i32" in stripped
    assert stripped.count("stablehlo.dot_general") == 2


def test_group_axes_follow_row_major_mesh():
    assert group_axes([(0, 1), (2, 3), (4, 5), (6, 7)], MESH) == ("model",)
    assert group_axes([(0, 2, 4, 6), (1, 3, 5, 7)], MESH) == ("batch",)
    assert group_axes([tuple(range(8))], MESH) == ("batch", "model")
    assert group_axes([(0,), (1,)], MESH) == ()
    assert group_axes([(0, 1), (1, 2)], MESH) == ("batch", "model")  # permute pairs


def test_parse_instruction_tuple_shape_and_attributes():
    line = ('ROOT %ag-start = (f32[64,16]{1,0}, f32[256,16]{1,0}) all-gather-start(%p), channel_id=3, '
            'replica_groups={{0,2,4,6},{1,3,5,7}}, dimensions={0}, metadata={op_name="a, b=c" source_line=2}')
    parsed = parse_instruction(line)
    assert parsed.name == "ag-start" and parsed.opcode == "all-gather-start"
    assert parsed.shapes == (HloShape("f32", (64, 16)), HloShape("f32", (256, 16)))
    assert parsed.attributes["replica_groups"] == "{{0,2,4,6},{1,3,5,7}}"
    assert parsed.attributes["dimensions"] == "{0}"
    assert HloShape("bf16", (3, 5)).nbytes == 30 and HloShape("pred", ()).nbytes == 1


def test_compare_flags_a_wrong_shard():
    from jaxlib import xla_client

    device = jax.devices("cpu")[0]
    reference = np.arange(12, dtype=np.float32).reshape(3, 4)
    replicated = [xla_client.HloSharding.replicate().to_proto()]
    good = compare_outputs([[jax.device_put(reference, device)]], [reference], replicated, [device])
    assert good == {"match": True, "max_abs_error": 0.0, "outputs": 1, "nan_values": 0, "nan_mismatches": 0,
                    "worst": []}
    bad = compare_outputs([[jax.device_put(reference, device)], [jax.device_put(reference + 1e-2, device)]],
                          [reference, reference], replicated * 2, [device], names=["result['a']", "result['b']"])
    assert not bad["match"] and bad["max_abs_error"] == pytest.approx(1e-2, rel=1e-2)
    # 1e-2 off an output whose largest magnitude is 11: relative 1e-2 / 11, over 1e-5 + 1e-4 * 11
    [worst] = bad["worst"]
    assert worst["name"] == "result['b']" and not worst["match"] and worst["scale"] == 11.0


# ---- inputs -----------------------------------------------------------------------------


def test_inputs_are_scaled_like_an_initializer():
    """A weight [256, 64] is N(0, 1/256) (std 1/16), a vector N(0, 0.01), a scalar in [0.5, 1.5), a second
    moment |N(0, 1/256)|; integers index every dimension; each argument is the same for the same seed."""
    from toast.xla.numerics import random_input, random_inputs

    arguments = [((256, 64), "f32"), ((64,), "f32"), ((), "f32"), ((8, 3), "i32"), ((256, 64), "f32")]
    weight, vector, scalar, ints, moment = random_inputs(arguments, seed=3, non_negative=frozenset({4}))
    assert weight.dtype == np.float32 and abs(weight.mean()) < 0.01 and weight.std() == pytest.approx(1 / 16, rel=0.05)
    assert vector.std() == pytest.approx(0.1, rel=0.3) and (vector < 0).any()
    assert 0.5 <= float(scalar) < 1.5
    assert ints.dtype == np.int32 and ints.min() >= 0 and ints.max() < 3
    assert moment.min() >= 0 and moment.mean() == pytest.approx((2 / np.pi) ** 0.5 / 16, rel=0.05)
    again = random_input((256, 64), "f32", seed=3, index=0, high=3)
    assert np.array_equal(again, weight)
    assert not np.array_equal(random_input((256, 64), "f32", seed=4, index=0, high=3), weight)


def _reaches_roots(a, b, c, d, e, f, g):
    """a: through a called function into sqrt; b: through a loop into log; c: a second moment (Adam's
    v / sqrt(v)); d: through a reduction into rsqrt (a layer norm: not marked; nor by the divisor of rsqrt's
    derivative had this been differentiated, which d reaches squared); e: through a matmul into sqrt (not marked);
    f: through a matmul and a sum into a divisor; g: into a softmax's divisor, but through
    its exponential (not marked)."""
    root = jax.jit(lambda t: jax.numpy.sqrt(t * 2.0))
    v = 0.999 * c + 0.001 * (e * e)
    variance = jax.numpy.mean(d * d, axis=-1, keepdims=True)
    scores = f @ f.T
    return (root(a), jax.lax.fori_loop(0, 2, lambda i, t: jax.numpy.log(t + 1.0), b),
            e / jax.numpy.sqrt(v), d * jax.lax.rsqrt(variance), jax.numpy.sqrt(e @ e),
            scores / jax.numpy.sum(scores, axis=0), jax.nn.softmax(g))


def test_non_negative_arguments_are_those_that_reach_a_root_elementwise():
    from jax.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    from toast.xla.numerics import non_negative_arguments

    spec = jax.ShapeDtypeStruct((4, 4), np.float32)
    text = jax.jit(_reaches_roots).lower(*[spec] * 7).as_text()
    assert "call @" in text and "stablehlo.while" in text
    context = jax_mlir.make_ir_context()
    with context:
        found = non_negative_arguments(ir.Module.parse(text))
    assert found == {0, 1, 2, 5}  # e reaches sqrt elementwise too, but squared (e * e in v)


# ---- the worker process: time limit, signals, memory ------------------------------------------

_FAKE_WORKER = """
import os, signal, sys, time
sys.stdin.read()
print("toast-xla-stage: running the sharded module", file=sys.stderr, flush=True)
{body}
"""


def _fake_worker(monkeypatch, body: str) -> None:
    """The worker replaced by a script that says it runs the sharded module, then does ``body``."""
    import sys

    from toast.xla import worker

    monkeypatch.setattr(worker, "worker_command", lambda: [sys.executable, "-c", _FAKE_WORKER.format(body=body)])


def test_a_worker_killed_by_sigkill_is_reported_as_out_of_memory_with_its_peak(monkeypatch):
    """The kernel's out-of-memory killer sends SIGKILL: say so, with the worker's peak (300 MiB touched, plus the
    interpreter), not 'exit status -9, no message'. The peak is the worker's own, not its parent's: Linux keeps
    ru_maxrss across exec, so a worker spawned by a 700 MiB process read as 700 MiB (a test run's 1.2 GiB in CI)."""
    from toast.xla.worker import run_worker

    parent = bytearray(700 << 20)  # a large parent, as a test run or a notebook is
    parent[::4096] = b"\1" * len(parent[::4096])  # touched: resident
    _fake_worker(monkeypatch, "block = bytearray(300 << 20)\ntime.sleep(0.3)\nos.kill(os.getpid(), signal.SIGKILL)")
    with pytest.raises(ToastError) as caught:
        run_worker({}, devices=1, timeout_s=60)
    del parent
    message = str(caught.value)
    found = re.fullmatch(r"XLA check worker was killed \(out of memory\?\) while running the sharded module; "
                         r"it peaked at (\d+) MiB resident", message)
    assert found is not None, message
    assert 300 <= int(found.group(1)) < 400


def test_an_aborted_worker_reports_xla_reason(monkeypatch):
    """XLA ends a CPU collective it waited for too long with a fatal log line and abort()."""
    from toast.xla.worker import run_worker

    fatal = ("F1127 01:12:21.798031   11423 rendezvous.cc:161] [id=4] Termination timeout for `all reduce` of 40 "
             "seconds exceeded. Exiting to ensure a consistent program state.")
    _fake_worker(monkeypatch, f"print({fatal!r}, file=sys.stderr)\nprint('*** Check failure stack trace: ***', "
                              f"file=sys.stderr, flush=True)\nos.abort()")
    with pytest.raises(ToastError, match=r"^XLA check worker died of SIGABRT while running the sharded module; it "
                                         r"peaked at .* resident: \[id=4\] Termination timeout for `all reduce` of 40 "
                                         r"seconds exceeded\. Exiting to ensure a consistent program state\.$"):
        run_worker({}, devices=1, timeout_s=60)


def test_a_worker_past_its_time_limit_says_where_and_why(monkeypatch):
    import time

    from toast.xla.worker import WorkerTimeout, run_worker

    stuck = ("E1127 01:10:52.112482   10073 rendezvous.cc:116] [id=1] This thread has been waiting for `all reduce` "
             "for 20 seconds and may be stuck.")
    _fake_worker(monkeypatch, f"print({stuck!r}, file=sys.stderr, flush=True)\ntime.sleep(60)")
    start = time.monotonic()
    with pytest.raises(WorkerTimeout) as caught:
        run_worker({}, devices=1, timeout_s=2)
    assert time.monotonic() - start < 30
    assert str(caught.value) == (
        "the XLA check did not finish within 2 s (it was running the sharded module): XLA's CPU collectives waited "
        "for the devices' threads, which the host's cores did not run in time (a busy machine?); give it longer "
        "with timeout_s=SECONDS")


def test_xla_waits_for_collectives_as_long_as_the_worker_may_run(monkeypatch):
    """XLA aborts a CPU collective after 40 s by default; the worker's limit (plus a minute) replaces that."""
    from toast.xla.worker import run_worker

    _fake_worker(monkeypatch, "import json\nprint(json.dumps({'flags': os.environ['XLA_FLAGS']}))")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_cpu_enable_fast_math=false")
    reply = run_worker({}, devices=8, timeout_s=600)
    assert reply["flags"].split() == ["--xla_cpu_enable_fast_math=false",
                                      "--xla_cpu_collective_call_terminate_timeout_seconds=660",
                                      "--xla_force_host_platform_device_count=8"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_collective_call_terminate_timeout_seconds=5")
    assert "terminate_timeout_seconds=5 " in run_worker({}, devices=8, timeout_s=600)["flags"]


def test_a_sharded_run_larger_than_the_memory_available_is_refused_up_front():
    from toast.xla.worker import _memory_shortfall

    gib = 2**30
    assert _memory_shortfall(gib, 8, 4 * gib) == (
        "the sharded run needs about 8 GiB (8 host devices x 1 GiB that XLA allocates for each) and this machine "
        "has 4 GiB available; free memory, or validate the program at a smaller size (a smaller batch, fewer "
        "layers)")
    assert _memory_shortfall(gib, 8, 9 * gib) == ""
    assert _memory_shortfall(gib, 8, None) == ""
