"""The fusion planner's memory traffic is linear in depth: a value several kernels read is stored once.

Kernel bytes are the HBM bytes every kernel moves at its boundary (``CostModel.kernel_work``), summed over
the kernels times their repeats, for the unsharded program on one device. The depth tests build the
``KernelPlan`` straight from the lowered program, with the rules' kernel tables read off the analysis of a
small program (they are by op kind): analyzing a 24-layer step takes longer than this file may. One test checks
that these bytes are the cost model's. Expected numbers are worked out by hand in the docstrings.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toast import CostModel, ShardingModel, analyze, parse_mesh
from toast.analysis.kernel_semantics import KernelSemantics
from toast.cost.collectives import storage_bits
from toast.cost.hardware import load_hardware
from toast.cost.kernels import KernelPlan
from toast.examples.gpt import gpt_train_step
from toast.frontend.ir import Program
from toast.frontend.stablehlo import read_callable

ROOT = Path(__file__).resolve().parent.parent
MEGATRON = ROOT.parent / "shared" / "reference" / "published" / "megatron_gpt.py"


@functools.cache
def _semantics() -> KernelSemantics:
    return analyze("toast.examples.mlp:mlp", engine="embedded").kernel_semantics


def _plan(program: Program) -> KernelPlan:
    return KernelPlan(program, semantics=_semantics())


def _value_bytes(program: Program) -> np.ndarray:
    """Bytes of every value on one device (whole bytes, as the cost model counts them)."""
    return np.asarray([(math.prod(v.shape) * storage_bits(v) + 7) // 8 for v in program.values], dtype=np.float64)


def _moved(plan: KernelPlan) -> np.ndarray:
    """Bytes each kernel moves per launch: what it reads and writes, and its scratch written and read back."""
    size = _value_bytes(plan.program)
    count = len(plan.kernels)
    read_kernel, _, read_weight = plan.reads
    write_kernel, _, write_weight = plan.writes
    scratch_kernel, scratch_value, scratch_scale = plan.scratch
    return (np.bincount(read_kernel, weights=size[read_weight], minlength=count)
            + np.bincount(write_kernel, weights=size[write_weight], minlength=count)
            + np.bincount(scratch_kernel, weights=2.0 * size[scratch_value] * scratch_scale, minlength=count))


def _kernel_bytes(plan: KernelPlan) -> float:
    return float((_moved(plan) * np.asarray([k.repeats for k in plan.kernels], dtype=np.float64)).sum())


def _widest_read(plan: KernelPlan) -> int:
    """The most buffers one kernel reads."""
    return int(np.bincount(plan.reads[0], minlength=len(plan.kernels)).max())


def _gpt(layers: int) -> KernelPlan:
    fn, args = gpt_train_step(layers=layers, batch=2, seq=32, d_model=64, heads=4, vocab=128, dtype=jnp.bfloat16)
    return _plan(read_callable(fn, args, name=f"gpt_L{layers}"))


def _plans_of_layers(build, depths=(12, 24)):
    return [build(layers) for layers in depths]


def test_the_helper_counts_the_cost_models_kernel_bytes():
    """The bytes these tests sum are ``CostModel.kernel_work``'s (a 2-layer step, analyzed)."""
    fn, args = gpt_train_step(layers=2, batch=2, seq=32, d_model=64, heads=4, vocab=128, dtype=jnp.bfloat16)
    analysis = analyze("gpt_L2", fn=fn, args=args, engine="embedded")
    model = ShardingModel(analysis, parse_mesh("d=1"))
    costs = CostModel(model, load_hardware("h100"))
    _, moved, _ = costs.kernel_work(model.initial())
    plan = _plan(analysis.program)
    assert len(plan.kernels) == len(costs.plan.kernels)
    assert _kernel_bytes(plan) == pytest.approx(float((moved * costs.repeats).sum()), rel=1e-12)


def test_gpt_step_kernel_bytes_double_with_depth():
    """24 layers move 2x the bytes of 12 (+-5%): every layer adds the same kernels, none reads all layers."""
    twelve, twenty_four = _plans_of_layers(_gpt)
    ratio = _kernel_bytes(twenty_four) / _kernel_bytes(twelve)
    assert 1.9 <= ratio <= 2.1, f"kernel bytes at 24 layers / at 12 = {ratio:.3f}"
    assert _widest_read(twenty_four) == _widest_read(twelve)


@pytest.mark.slow  # 40 s on the 2-core machine: two Megatron steps of 12 and 24 layers (the GPT test above stays)
@pytest.mark.skipif(not MEGATRON.is_file(), reason="../shared/reference/published is not beside the checkout")
def test_megatron_step_kernel_bytes_double_with_depth():
    """The same for Megatron's GPT step (jax.checkpoint per block, bf16, Adam with fp32 masters), on 8
    sequences: at one, the vocabulary's kernels and Adam's outweigh the layers' activations."""
    spec = importlib.util.spec_from_file_location("megatron_gpt", MEGATRON)
    assert spec is not None and spec.loader is not None
    megatron = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(megatron)

    def build(layers):
        fn, args = megatron.megatron_gpt("1.7B", batch=8, layers=layers)
        return _plan(read_callable(fn, args, name=f"megatron_L{layers}"))

    twelve, twenty_four = _plans_of_layers(build)
    ratio = _kernel_bytes(twenty_four) / _kernel_bytes(twelve)
    assert 1.9 <= ratio <= 2.1, f"kernel bytes at 24 layers / at 12 = {ratio:.3f}"
    assert _widest_read(twenty_four) == _widest_read(twelve)


N = 256 * 512  # elements of each [256, 512] f32 operand
F32 = 4


def _two_reductions_of(fn, inputs: int) -> KernelPlan:
    args = [jax.ShapeDtypeStruct((256, 512), jnp.float32)] * inputs
    return _plan(read_callable(fn, args, name="two_readers"))


def _sum_and_reduce_twice(x, y, z, w):
    s = x + y + z + w
    return s.sum(axis=0), s.sum(axis=1)


def _add_and_reduce_twice(x, y):
    s = x + y
    return s.sum(axis=0), s.sum(axis=1)


def test_a_value_two_kernels_read_is_written_once_and_read_twice():
    """``s = x + y + z + w`` read by two reductions (over different dims: two kernels). Recomputing it in both
    would read the four inputs twice, 2·4·4N = 32N bytes; storing it reads them once and writes s (16N + 4N),
    then each reduction reads s (4N each): 28N. So one kernel makes s:

    - the add chain: reads x, y, z, w (4·4N) and writes s (4N): 20N = 2,621,440 bytes;
    - the column sums: read s (4N) and write 512 f32: 524,288 + 2,048 = 526,336;
    - the row sums: read s (4N) and write 256 f32: 524,288 + 1,024 = 525,312;

    3,673,088 bytes in all (recomputed: 4·4N·2 + 2,048 + 1,024 = 4,197,376)."""
    plan = _two_reductions_of(_sum_and_reduce_twice, 4)
    assert [k.kind for k in plan.kernels] == ["fusion", "reduction", "reduction"]
    assert _moved(plan).tolist() == [2_621_440, 526_336, 525_312]
    assert _kernel_bytes(plan) == 3_673_088
    (s,) = plan.writes[1][plan.writes[0] == 0].tolist()  # the one value the add chain writes
    assert plan.program.values[s].shape == (256, 512)
    assert sorted(plan.reads[0][plan.reads[1] == s].tolist()) == [1, 2]  # read by both reductions


def test_a_producer_is_recomputed_where_that_moves_fewer_bytes():
    """``s = x + y`` read by the same two reductions: recomputing it in both reads x and y twice, 2·2·4N = 16N
    bytes, less than storing it (8N read + 4N written + 2·4N read = 20N), so XLA fuses it into both (and so
    does the plan): two kernels, each reading x and y (2·4N = 1,048,576 bytes) and writing its sums: 1,050,624
    and 1,049,600, 2,100,224 bytes in all."""
    plan = _two_reductions_of(_add_and_reduce_twice, 2)
    assert [k.kind for k in plan.kernels] == ["reduction", "reduction"]
    assert _moved(plan).tolist() == [1_050_624, 1_049_600]
    assert _kernel_bytes(plan) == 2_100_224
