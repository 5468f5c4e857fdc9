"""Collective matmul: a tensor-parallel collective folded into the matmul it feeds or follows, as XLA's TPU compiler
decomposes the two.

With the profile's ``[compiler] collective_matmul`` on, XLA's SPMD partitioner rewrites a matmul whose operand is
all-gathered over a group of n devices (``xla_tpu_enable_windowed_einsum_for_all_gather``), or whose partial result
is reduce-scattered over it (``xla_tpu_enable_windowed_einsum_for_reduce_scatter``), as a loop of n steps ("windowed
einsum"): each step multiplies the shard at hand while a collective-permute brings the next one (an all-gather), or
passes on the partial sum of the shard just multiplied (a reduce-scatter), so the permutes run under the partial
matmuls (Wang et al., "Overlap Communication with Dependent Computation via Decomposition in Large Deep Learning
Models", ASPLOS 2023, https://doi.org/10.1145/3567955.3567959; the scaling book's collective matmul,
https://jax-ml.github.io/scaling-book/sharding/; JAX's shard_map collective matmul,
https://docs.jax.dev/en/latest/notebooks/shard_map.html). An all-reduce of a matmul's partial result is priced the
same way over its whole time (an approximation: XLA windows its reduce-scatter half with this matmul and its
all-gather half with the matmul that reads it, when the activations between them are sharded).

**Exposed time.** The steps form a two-stage pipeline of n chunks: 1/n of the matmul (m = M / n) and 1/n of the
collective (c = C / n) each, the collective of a chunk overlapping the matmul of the next. One step's communication
has nothing to overlap (the last partial sum's, or the first shard's), and each of the other n - 1 steps waits for
whatever its communication takes beyond its matmul::

    exposed = c + (n - 1) · max(0, c - m) = C / n + (n - 1) / n · max(0, C - M)

with C the collective's seconds as the communication stream runs it (``toast.cost.network``) and M the matmul
kernel's seconds without its launch overhead. The matmul's kernel takes that much longer; the rest of C is hidden.

**When.** A collective folds only where that exposes less than the communication stream would: less than
``max(0, C - slack)``, with slack the compute between the collective's operand being ready and its consumer
(independent kernels the stream hides it behind). A data-parallel gradient all-reduce read only by the optimizer
stays on the stream, as XLA leaves such reductions asynchronous.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from toast.analysis.kernel_semantics import KernelClass
from toast.cost.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from toast.cost.kernels import KernelPlan


class CollectiveMatmul:
    """Which collectives can fold into a matmul kernel.

    Args:
      plan: the kernel plan.
      contractions: the ops that contract (those with FLOP names: ``Analysis.flop_names``); the ones in a
        ``KernelClass.MATMUL`` kernel are the matmuls collectives fold into.
    """

    def __init__(self, plan: KernelPlan, contractions: Iterable[int]):
        kernel_of_op = np.full(len(plan.program.ops), -1, dtype=np.int64)
        for op_id in contractions:
            kernel = int(plan.kernel_of_op[op_id])
            if kernel >= 0 and plan.kernels[kernel].kind == KernelClass.MATMUL:
                kernel_of_op[op_id] = kernel
        self.kernel_of_op = kernel_of_op

    def kernels(self, kind: np.ndarray, op: np.ndarray, operand: np.ndarray) -> np.ndarray:
        """``int64[rows]``: the matmul kernel each collective folds into, ``-1`` for none: an all-gather of a
        matmul's operand (``operand >= 0``), an all-reduce or reduce-scatter of its partial result (``-1``).

        Args:
          kind: ``int64[rows]``, codes of ``toast.cost.collectives.KINDS``.
          op: ``int64[rows]``, the op each belongs to (the user for a use, the producer for a result).
          operand: ``int64[rows]``, the operand index of a use, ``-1`` for a result.
        """
        eligible = np.where(operand >= 0, kind == ALL_GATHER, (kind == ALL_REDUCE) | (kind == REDUCE_SCATTER))
        return np.where(eligible, self.kernel_of_op[op], -1)


def exposed_seconds(communication: np.ndarray, matmul: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """``float64[rows]``: seconds a collective folded into a matmul leaves exposed (module docstring):
    ``C / n + (n - 1) / n · max(0, C - M)``.

    Args:
      communication: ``float64[rows]``, C, the collective's seconds.
      matmul: ``float64[rows]``, M, the matmul kernel's seconds (one launch, without its overhead).
      devices: ``int64[rows]``, n, the devices in the collective's group.
    """
    n = np.maximum(devices, 1).astype(np.float64)
    return communication / n + (n - 1) / n * np.maximum(communication - matmul, 0.0)


def slack(item_time: np.ndarray, ready: np.ndarray, consumer: np.ndarray) -> np.ndarray:
    """``float64[rows]``: seconds of the items strictly between each collective's ready item and its consumer,
    what the communication stream can hide it behind.

    Args:
      item_time: ``float64[items]``, seconds of each item in order.
      ready: ``int64[rows]``, the item after which the operand is ready (``-1``: before the first).
      consumer: ``int64[rows]``, the item that waits for the result (``len(item_time)``: the end).
    """
    starts = np.concatenate(([0.0], np.cumsum(item_time)))
    begin = np.clip(ready + 1, 0, len(item_time))
    end = np.clip(consumer, begin, len(item_time))
    return starts[end] - starts[begin]


def folds(kernel: np.ndarray, exposed: np.ndarray, communication: np.ndarray, hidden_behind: np.ndarray
          ) -> np.ndarray:
    """``bool[rows]``: the collectives that fold into their matmul (``kernel >= 0``) because that leaves less
    exposed than the communication stream would: ``exposed < max(0, communication - hidden_behind)``."""
    return (kernel >= 0) & (exposed < np.maximum(communication - hidden_behind, 0.0))
