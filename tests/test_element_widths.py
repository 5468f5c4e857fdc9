"""Element widths come from the MLIR type, once; the cost model prices every tensor at its real
width and refuses a type it cannot price (expected byte counts worked out by hand)."""

from __future__ import annotations

import pytest

import toast
from toast.cost import CommunicationModel

NARROW = """
func.func @main(%a: tensor<64x32xf8E4M3FN>, %b: tensor<64x32xi4>, %c: tensor<64x32xi1>)
    -> (tensor<64x32xf8E4M3FN>, tensor<64x32xi4>, tensor<64x32xi1>) {
  %0 = stablehlo.negate %a : tensor<64x32xf8E4M3FN>
  %1 = stablehlo.add %b, %b : tensor<64x32xi4>
  %2 = stablehlo.not %c : tensor<64x32xi1>
  return %0, %1, %2 : tensor<64x32xf8E4M3FN>, tensor<64x32xi4>, tensor<64x32xi1>
}
"""


def _model(text: str, mesh: str) -> toast.ShardingModel:
    analysis = toast.analyze(toast.read_text(text, source="narrow.mlir"), engine="embedded")
    return toast.ShardingModel(analysis, toast.parse_mesh(mesh))


def test_widths_are_read_from_the_mlir_type():
    program = toast.read_text(NARROW, source="narrow.mlir")
    assert [(v.dtype, v.bits) for v in program.values[:3]] == [("f8E4M3FN", 8), ("i4", 4), ("i1", 1)]


def test_f8_and_i4_are_priced_at_their_width():
    model = _model(NARROW, "x=2")
    sizes = CommunicationModel(model).value_bytes(model.initial()).tolist()
    # 64*32 = 2048 elements: f8 one byte each, i4 packed two per byte, i1 stored as a byte.
    assert sizes == [2048, 1024, 2048, 2048, 1024, 2048]
    # Sharding dim 0 over x=2 halves every shard (the three colors of dim 0).
    state = model.initial()
    for color in sorted({int(model.analysis.color_of[model.analysis.names.def_base[v]]) for v in (0, 1, 2)}):
        state = model.apply(state, toast.Action(color, "x"))
    assert CommunicationModel(model).value_bytes(state).tolist() == [1024, 512, 1024, 1024, 512, 1024]
    # Arguments and results live for the whole step: 2048 + 1024 + 2048 twice.
    cost = toast.CostModel(model, toast.load_hardware("h100")).evaluate(model.initial())
    assert cost.peak_bytes == 2 * (2048 + 1024 + 2048)


def test_an_element_type_without_a_width_is_a_clear_error():
    text = "func.func @main(%a: tensor<4x8xindex>) -> tensor<4x8xindex> {\n  return %a : tensor<4x8xindex>\n}\n"
    model = _model(text, "x=2")
    with pytest.raises(toast.ToastError, match=r"cannot price element type index") as caught:
        toast.CostModel(model, toast.load_hardware("h100"))
    assert "\n" not in str(caught.value)
