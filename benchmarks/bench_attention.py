"""toast's price of cuDNN's causal fused attention against its measured time on one H100.

    python benchmarks/bench_attention.py

The measurements are ``benchmarks/data/h100_attention.json`` (``benchmarks/gpu_attention.py`` on an H100,
jax 0.11.2): ``jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")``, bf16, B=2,
S=8192, 64 query heads, 8 key/value heads, head dim 128, forward and forward + gradient. The programs priced are
the small lowerings of ``tests/fixtures/kernels/`` (B=2, S=256, 8 and 2 heads, head dim 64) with every tensor
type scaled to those shapes (the rules read the calls' shapes, mask_type and layout; the backend_config's own
sizes stay small and are not read). Per row: the cuDNN calls' seconds on one device by the h100 profile (the
calls alone: the small programs' transposes and loss are left out), the measured seconds (the whole jitted
step), and predicted / measured. Prints Markdown.
"""

from __future__ import annotations

import json
from pathlib import Path

import toast
from toast.frontend.stablehlo import read_text

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
MEASURED = ROOT / "benchmarks" / "data" / "h100_attention.json"

# The fixtures' tensor types -> the measured shapes' ([batch, seq, heads, dim] operands; [batch, heads, seq, dim]
# results; [batch, heads, seq] statistics).
SCALED = {
    "tensor<2x256x8x64x": "tensor<2x8192x64x128x",
    "tensor<2x256x2x64x": "tensor<2x8192x8x128x",
    "tensor<2x8x256x64x": "tensor<2x64x8192x128x",
    "tensor<2x2x256x64x": "tensor<2x8x8192x128x",
    "tensor<2x8x256xf32>": "tensor<2x64x8192xf32>",
}


def _scaled(text: str) -> str:
    for small, large in SCALED.items():
        text = text.replace(small, large)
    return text


def _cudnn_seconds(text: str, hardware: toast.Hardware) -> float:
    """The seconds of the program's cuDNN calls on one device."""
    analysis = toast.analyze(read_text(text), engine="embedded")
    if analysis.unruled_ops or analysis.unpriced_ops:
        raise SystemExit(f"unruled {analysis.unruled_ops} or unpriced {analysis.unpriced_ops} ops")
    model = toast.ShardingModel(analysis, toast.parse_mesh("d=1"))
    cost = toast.CostModel(model, hardware)
    seconds, _, _ = cost.kernel_times(model.initial())
    calls = [op.id for op in analysis.program.ops
             if op.kind == "stablehlo.custom_call" and str(op.attr("call_target_name")).startswith("__cudnn$fmha")]
    return float(sum(seconds[int(cost.plan.kernel_of_op[op])] for op in calls))


def main() -> None:
    hardware = toast.load_hardware("h100")
    document = json.loads(MEASURED.read_text())
    row = next(r for r in document["rows"] if r["implementation"] == "cudnn" and r["seq"] == 8192)
    print(f"cuDNN causal attention, B={row['batch']} S={row['seq']} H={row['heads']} KV={row['kv_heads']} "
          f"D={row['head_dim']} bf16; measured {document['date']} on {document['device']} (jax {document['jax']})\n")
    print("| step | FLOPs (causal) | toast | measured | toast / measured |")
    print("|---|---|---|---|---|")
    for step, fixture, flops, measured in (
            ("forward", "cudnn_fmha_fwd.mlir", row["forward_flops"], row["forward_s"]),
            ("forward + backward", "cudnn_fmha_grad.mlir", row["forward_flops"] + row["backward_flops"],
             row["forward_backward_s"])):
        predicted = _cudnn_seconds(_scaled((FIXTURES / fixture).read_text()), hardware)
        print(f"| {step} | {flops:.3g} | {predicted * 1e3:.2f} ms | {measured * 1e3:.2f} ms | "
              f"{predicted / measured:.2f} |")


if __name__ == "__main__":
    main()
