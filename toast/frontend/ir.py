"""The program representation the analysis works on: a flat list of ops over SSA values.

The StableHLO reader (``toast.frontend.stablehlo``) builds a ``Program``; the fact writer
(``toast.facts``) turns it into Datalog facts. Private functions reached by ``func.call`` are
inlined at every call site, so each op here is one *instance* of an op of the input module
and every value has exactly one definition.

Ids are dense integers: ``program.values[i].id == i`` and ``program.ops[i].id == i``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from toast.frozen import pickled_by_constructor

# Ops that end a region and hand its values on (a loop body's next carry, a call's results).
TERMINATORS = frozenset({"stablehlo.return", "func.return", "sdy.return"})
# Memory kinds (``Value.memory_kind``) in the host's memory rather than the device's (JAX's
# ``jax.memory.Space.Host`` is ``"pinned_host"``).
HOST_MEMORY_KINDS = frozenset({"pinned_host", "unpinned_host"})


@pickled_by_constructor
@dataclass(frozen=True, slots=True)
class Value:
    """One SSA value (op result, block argument or function argument).

    Attributes:
      id: dense index into ``Program.values``.
      name: how users see it: the argument's name (``x``, ``params['w1']``), a function
        result's ``jax.result_info`` (``result[0]``), or the SSA name (``%12``; values of
        inlined private functions are prefixed ``@callee#k:`` for the k-th call site).
      shape: static dimension sizes, ``()`` for scalars and for non-tensor values (tokens).
      dtype: element type as MLIR prints it (``f32``, ``i32``), ``""`` for non-tensors.
      bits: width of one element in bits, as the MLIR type states it (32 for ``f32``, 8 for
        ``f8E4M3FN``, 4 for ``i4``, 1 for ``i1``, 64 for ``complex<f32>``); 0 for non-tensors
        and for element types without a width (quantized or opaque types).
      loc: ``file:line`` of the user's Python that created it, ``""`` when unknown.
      memory_kind: the memory the program places it in, as the program states it: ``"pinned_host"``,
        ``"unpinned_host"`` or ``"device"`` for the result of a placement annotation (``jax.device_put(x,
        jax.memory.Space.Host)`` and offloading remat policies lower to ``annotate_device_placement``) and for an
        entry argument with a ``mhlo.memory_kind``; ``""`` where the program states none (the value lies where
        its buffer does: ``toast.cost.kernels.KernelPlan.host_buffer`` works that out).
    """

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    bits: int
    loc: str
    memory_kind: str = ""


@pickled_by_constructor
@dataclass(frozen=True, slots=True)
class Op:
    """One operation instance.

    Attributes:
      id: dense index into ``Program.ops``.
      kind: the op's full name, e.g. ``stablehlo.dot_general``, ``func.call``,
        ``stablehlo.return``, ``func.return``.
      operands: value ids, in operand order (each position is one *use*).
      results: value ids of the op's results.
      attrs: decoded attributes the rules need, as sorted ``(name, value)`` pairs; values are
        ints, strings, tuples of ints or dicts of those (dimension numbers).
      loc: ``file:line`` of the user's Python, ``""`` when unknown.
      parent: ``(op id, region index)`` of the region holding this op, ``None`` at top level.
        Inlined callee bodies sit in region 0 of their ``func.call``.
      regions: for each region of the op, the value ids of its entry block's arguments.
    """

    id: int
    kind: str
    operands: tuple[int, ...]
    results: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    loc: str = ""
    parent: tuple[int, int] | None = None
    regions: tuple[tuple[int, ...], ...] = ()

    def attr(self, name: str, default: Any = None) -> Any:
        """The decoded attribute ``name`` or ``default``."""
        for key, value in self.attrs:
            if key == name:
                return value
        return default


@dataclass(frozen=True, slots=True)
class Program:
    """A whole program: the entry function with private functions inlined.

    Attributes:
      name: the module's name (``jit_mlp``) or the input's file name.
      values: every value, indexed by id.
      ops: every op instance, indexed by id, in program order (parents before children).
      arguments: value ids of the entry function's arguments.
      results: value ids the entry function returns, in order.
      text: the StableHLO text the program was read from (``""`` when built by hand); the
        sharded module (``toast.output.sharded_stablehlo``) annotates this text.
    """

    name: str
    values: tuple[Value, ...]
    ops: tuple[Op, ...]
    arguments: tuple[int, ...]
    results: tuple[int, ...]
    text: str = field(default="", repr=False, compare=False)

    producer: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The one producer map of the program, computed once: ``producer[value id]`` is the op
        # defining the value (its result or the block argument of one of its regions), ``-1``
        # for the entry function's arguments.
        producer = [-1] * len(self.values)
        for op in self.ops:
            for value_id in op.results:
                producer[value_id] = op.id
            for args in op.regions:
                for value_id in args:
                    producer[value_id] = op.id
        object.__setattr__(self, "producer", tuple(producer))

    def op_label(self, op_id: int) -> str:
        """An op named for people: by its first result (``%3``), else ``op#<id>`` (returns)."""
        op = self.ops[op_id]
        return self.values[op.results[0]].name if op.results else f"op#{op_id}"

    def fingerprint(self) -> str:
        """A digest of the ops, shapes and element types (not names or locations): strategy
        files carry it so that a strategy is never applied to another program."""
        digest = hashlib.sha256()
        for op in self.ops:
            digest.update(op.kind.encode())
            for value_id in op.operands + op.results:
                value = self.values[value_id]
                digest.update(f"{value.shape}{value.dtype};".encode())
        return digest.hexdigest()[:16]
