"""What one device runs each op as: the rules' kernel tables, read back for the cost model.

Every op family file under ``rules/ops/`` gives its kinds a ``kernel_class`` (a custom call's target a
``custom_call_class``) and rows of the small tables for the mechanics the kernel plan needs (an update in
place, an operand read only where sliced, ...); ``rules/schema.dl`` documents each relation. This module holds
them as one frozen value, keyed by op kind, so that ``toast.cost.kernels.KernelPlan`` names no op kind of its
own: a kind a researcher adds in a ``.dl`` file is priced as its row says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from toast.frontend.ir import Op

# What the cost model prices an op as when no rule classifies it (an ``unpriced_op``): a kernel of its own,
# by the bytes it reads and writes.
UNPRICED_CLASS = "library"


@dataclass(frozen=True, slots=True)
class KernelSemantics:
    """The rules' kernel tables (rules/schema.dl), by op kind.

    Attributes:
      kernel_class: ``kind -> class``, rules' ``kernel_class`` (the classes: ``known_kernel_class`` in rules/nda.dl).
      custom_call_class: ``call_target_name -> class`` for ``stablehlo.custom_call``.
      kernel_call_class: ``(call_target_name, kernel name) -> class`` for a custom call running a named kernel
        (rules/ops/kernels.dl); it takes precedence over its target's class.
      in_place_update: ``kind -> (target operand, update operand)``: the result is the target's buffer.
      touched_operand: ``(kind, operand)`` pairs read only where the op's result comes from.
      library_reads_in_place: kinds whose result a library call reads where it lies.
      multi_output_fusible: kinds whose sibling ops of one shape run as one kernel.
      keeps_elements: kinds whose result holds operand 0's elements, rearranged or converted.
      window_selection: ``kind -> (source operand, init operand)`` for select-and-scatter-like ops.
    """

    kernel_class: Mapping[str, str] = field(default_factory=dict)
    custom_call_class: Mapping[str, str] = field(default_factory=dict)
    kernel_call_class: Mapping[tuple[str, str], str] = field(default_factory=dict)
    in_place_update: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    touched_operand: frozenset[tuple[str, int]] = frozenset()
    library_reads_in_place: frozenset[str] = frozenset()
    multi_output_fusible: frozenset[str] = frozenset()
    keeps_elements: frozenset[str] = frozenset()
    window_selection: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def class_of(self, op: Op) -> str | None:
        """The op's kernel class, ``None`` when no rule gives one (an unpriced op)."""
        if op.kind == "stablehlo.custom_call":
            target = str(op.attr("call_target_name", ""))
            kernel = op.attr("kernel")
            if kernel and (target, str(kernel)) in self.kernel_call_class:
                return self.kernel_call_class[(target, str(kernel))]
            return self.custom_call_class.get(target)
        return self.kernel_class.get(op.kind)


def kernel_semantics(outputs: Mapping[str, list[tuple]]) -> KernelSemantics:
    """The ``KernelSemantics`` of the first stage's output rows (relations named as in rules/schema.dl)."""
    return KernelSemantics(
        kernel_class=dict(sorted((str(k), str(c)) for k, c in outputs["kernel_class"])),
        custom_call_class=dict(sorted((str(t), str(c)) for t, c in outputs["custom_call_class"])),
        kernel_call_class={(str(t), str(n)): str(c) for t, n, c in sorted(outputs["kernel_call_class"])},
        in_place_update={str(k): (int(t), int(u)) for k, t, u in sorted(outputs["in_place_update"])},
        touched_operand=frozenset((str(k), int(i)) for k, i in outputs["touched_operand"]),
        library_reads_in_place=frozenset(str(k) for (k,) in outputs["library_reads_in_place"]),
        multi_output_fusible=frozenset(str(k) for (k,) in outputs["multi_output_fusible"]),
        keeps_elements=frozenset(str(k) for (k,) in outputs["keeps_elements"]),
        window_selection={str(k): (int(s), int(i)) for k, s, i in sorted(outputs["window_selection"])},
    )
