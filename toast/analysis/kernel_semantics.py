"""What one device runs each op as: the rules' kernel tables, read back for the cost model.

Every op family file under ``rules/ops/`` gives its kinds a ``kernel_class`` (a custom call's target a
``custom_call_class``) and rows of the small tables for the mechanics the kernel plan needs (an update in
place, an operand read only where sliced, ...); ``rules/schema.dl`` documents each relation. This module holds
them as one frozen value, keyed by op kind, so that ``toast.cost.kernels.KernelPlan`` names no op kind of its
own: a kind a researcher adds in a ``.dl`` file is priced as its row says.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from toast.errors import ToastError
from toast.frontend.ir import Op


class KernelClass(enum.StrEnum):
    """What one device runs an op as: the closed vocabulary of the rules' ``kernel_class`` (``known_kernel_class``
    in rules/nda.dl lists the same; ``tests/test_kernel_classes.py`` checks the two agree). A member equals its
    text, so facts and CSV rows read the same."""

    VIEW = "view"  # moves no data: its result is its operand's buffer
    INLINE = "inline"  # an inlined call: its region runs in place, its results are what the region returns
    LOOP = "loop"  # a while loop: its body runs once per iteration, in place
    BRANCH = "branch"  # if/case: one region runs
    TERMINATOR = "terminator"  # a region's return: hands its operands on
    MATMUL = "matmul"  # a library call priced by its FLOPs (dot_general, convolution)
    LIBRARY = "library"  # another library call: a kernel of its own
    REDUCTION = "reduction"  # ends its kernel; its single-user producers fuse into it
    SCATTER = "scatter"  # ends its kernel; its updates are atomic adds
    CHEAP = "cheap"  # recomputed in every kernel reading it (broadcast, iota, constant)
    FUSIBLE = "fusible"  # elementwise-like: fuses into its readers


# What the cost model prices an op as when no rule classifies it (an ``unpriced_op``): a kernel of its own,
# by the bytes it reads and writes.
UNPRICED_CLASS = KernelClass.LIBRARY


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
      unknown_classes: the class rows whose class is no ``KernelClass`` (the rules' ``kernel_class_unknown``
        invariant fails on them; an analysis made with ``check_invariants=False`` holds them), keyed as
        ``(relation, kind)``, ``(relation, target)`` or ``(relation, target, kernel name)``: ``class_of`` refuses an
        op they classify.
    """

    kernel_class: Mapping[str, KernelClass] = field(default_factory=dict)
    custom_call_class: Mapping[str, KernelClass] = field(default_factory=dict)
    kernel_call_class: Mapping[tuple[str, str], KernelClass] = field(default_factory=dict)
    in_place_update: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    touched_operand: frozenset[tuple[str, int]] = frozenset()
    library_reads_in_place: frozenset[str] = frozenset()
    multi_output_fusible: frozenset[str] = frozenset()
    keeps_elements: frozenset[str] = frozenset()
    window_selection: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    unknown_classes: Mapping[tuple[str, ...], str] = field(default_factory=dict)

    def class_of(self, op: Op) -> KernelClass | None:
        """The op's kernel class, ``None`` when no rule gives one (an unpriced op).

        Raises:
          ToastError: a rule gives the op a class that is no ``KernelClass`` (``unknown_classes``).
        """
        if op.kind == "stablehlo.custom_call":
            target = str(op.attr("call_target_name", ""))
            kernel = op.attr("kernel")
            if kernel and (target, str(kernel)) in self.kernel_call_class:
                return self.kernel_call_class[(target, str(kernel))]
            found = self.custom_call_class.get(target)
            keys: tuple[tuple[str, ...], ...] = (("kernel_call_class", target, str(kernel)),
                                                 ("custom_call_class", target)) if kernel else (
                ("custom_call_class", target),)
        else:
            found = self.kernel_class.get(op.kind)
            keys = (("kernel_class", op.kind),)
        if found is None and self.unknown_classes:
            for key in keys:
                if key in self.unknown_classes:
                    row = ", ".join(f'"{part}"' for part in (*key[1:], self.unknown_classes[key]))
                    raise ToastError(f"rules' {key[0]}({row}): unknown kernel class "
                                     f"{self.unknown_classes[key]!r} (the known ones: {', '.join(KernelClass)})")
        return found


def kernel_semantics(outputs: Mapping[str, list[tuple]]) -> KernelSemantics:
    """The ``KernelSemantics`` of the first stage's output rows (relations named as in rules/schema.dl)."""
    known: dict[str, list[tuple[tuple[str, ...], KernelClass]]] = {}
    unknown: dict[tuple[str, ...], str] = {}
    for relation in ("kernel_class", "custom_call_class", "kernel_call_class"):
        known[relation] = []
        for *key, text in sorted(outputs[relation]):
            row_key = tuple(str(part) for part in key)
            if str(text) in _CLASSES:
                known[relation].append((row_key, KernelClass(str(text))))
            else:  # the rules' kernel_class_unknown row; refused where an op of it is priced
                unknown[(relation, *row_key)] = str(text)
    return KernelSemantics(
        kernel_class={kind: cls for (kind,), cls in known["kernel_class"]},
        custom_call_class={target: cls for (target,), cls in known["custom_call_class"]},
        kernel_call_class={(target, name): cls for (target, name), cls in known["kernel_call_class"]},
        in_place_update={str(k): (int(t), int(u)) for k, t, u in sorted(outputs["in_place_update"])},
        touched_operand=frozenset((str(k), int(i)) for k, i in outputs["touched_operand"]),
        library_reads_in_place=frozenset(str(k) for (k,) in outputs["library_reads_in_place"]),
        multi_output_fusible=frozenset(str(k) for (k,) in outputs["multi_output_fusible"]),
        keeps_elements=frozenset(str(k) for (k,) in outputs["keeps_elements"]),
        window_selection={str(k): (int(s), int(i)) for k, s, i in sorted(outputs["window_selection"])},
        unknown_classes=unknown,
    )


_CLASSES = frozenset(KernelClass)
