"""What users feed toast: StableHLO as text, as MLIR bytecode, or as a StableHLO portable
artifact (what ``jax.export`` serializes); anything else is one error line."""

from __future__ import annotations

import io

import jax
import pytest
from jax.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

import toast
from toast.cli import main
from toast.examples.mlp import mlp


@pytest.fixture(scope="module")
def mlp_text() -> str:
    fn, args = mlp()
    return jax.jit(fn).lower(*args).as_text(debug_info=True)


def _bytecode(text: str) -> bytes:
    buffer = io.BytesIO()
    ir.Module.parse(text, context=jax_mlir.make_ir_context()).operation.write_bytecode(buffer)
    return buffer.getvalue()


def test_bytecode_and_portable_artifacts_read_as_the_text_does(tmp_path, mlp_text):
    from_text = toast.read_text(mlp_text, source="mlp.mlir")
    (tmp_path / "bytecode.mlir").write_bytes(_bytecode(mlp_text))
    (tmp_path / "portable.mlir").write_bytes(
        stablehlo.serialize_portable_artifact_str(mlp_text, stablehlo.get_current_version()))
    for name in ("bytecode.mlir", "portable.mlir"):
        program = toast.read_file(tmp_path / name)
        assert program.fingerprint() == from_text.fingerprint(), name
        assert [v.name for v in program.values] == [v.name for v in from_text.values], name
        assert [op.loc for op in program.ops] == [op.loc for op in from_text.ops], name  # debug locations kept


@pytest.mark.parametrize(("content", "message"), [
    (b"\x00\xff\xfe not a module", "neither StableHLO text nor MLIR bytecode"),
    (b"ML\xefR\x00\x01truncated", "unreadable MLIR bytecode"),
])
def test_unreadable_input_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "broken.mlir"
    path.write_bytes(content)
    assert main(["analyze", str(path), "--engine", "embedded"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"toast: error: {path}: ") and message in lines[0]
