"""Fused attention on one GPU (run on a GPU machine): lower cuDNN's fused attention, time the attention kernels.

``python benchmarks/gpu_attention.py OUT_DIR`` writes

- ``cudnn_fmha_fwd.mlir`` and ``cudnn_fmha_grad.mlir``: ``jax.nn.dot_product_attention(..., implementation="cudnn",
  is_causal=True)`` at small shapes (bf16, B=2, S=256, 8 query heads, 2 key/value heads, head dim 64), forward and
  forward + gradient, lowered to StableHLO. cuDNN's ``__cudnn$fmha*`` custom calls are lowered only where cuDNN
  is present, so these files are how the rules meet them on a machine without a GPU;
- ``cudnn_fmha_variants.json``: the other forms of cuDNN's fused attention calls at those shapes, lowered the same
  way (``{case: StableHLO text, or {"error": ...}}``): no mask, a bias, padding (sequence lengths), a sliding
  window, the BNTH layout, dropout, FP8 (head dim 128, as cuDNN's FP8 training needs). The rules'
  ``tests/test_fused_kernels.py`` reads them from ``tests/fixtures/kernels/``. ``--lower-only`` stops here;
- ``gpu_attention.json``: seconds (median of 10 after 3 warm-ups) of causal attention forward and forward +
  backward per implementation (cuDNN; Pallas GPU ``mha``, a Triton kernel; XLA with the scores written out) at
  one H100 of the Llama-3-70B MaxText run's shapes (per device: B=2, S=8192, 64 query heads, 8 key/value heads,
  head dim 128; XLA's materialized scores at B=1, S=4096 to fit), with the FLOPs of the causal kernel
  (forward ``2·B·H·S²·D``: two matmuls over half the square; backward 2.5x that).
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from toast.cost.microbench import median_seconds


def _timed(fn, *args) -> float:
    return median_seconds(fn, args, warmups=3, runs=10)


def _inputs(batch: int, seq: int, heads: int, kv_heads: int, head_dim: int):
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (batch, seq, heads, head_dim), jnp.bfloat16)
    k = jax.random.normal(keys[1], (batch, seq, kv_heads, head_dim), jnp.bfloat16)
    v = jax.random.normal(keys[2], (batch, seq, kv_heads, head_dim), jnp.bfloat16)
    return q, k, v


def _attention(implementation: str):
    def forward(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
    return forward


def _mha(q, k, v):
    from jax.experimental.pallas.ops.gpu import attention

    repeat = q.shape[2] // k.shape[2]  # Pallas mha wants as many key/value heads as query heads
    k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
    return attention.mha(q, k, v, segment_ids=None, causal=True)


def _with_grad(forward):
    def loss(q, k, v):
        return forward(q, k, v).astype(jnp.float32).sum()
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _grad_of(forward):
    """forward's value and its gradient with respect to q, k and v (any further arguments held)."""
    def loss(*args):
        out = forward(*args)
        return (out[0] if isinstance(out, tuple) else out).astype(jnp.float32).sum()
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _variants() -> dict[str, object]:
    """The cuDNN fused attention calls of each form, lowered at the small shapes (text, or the error)."""
    # Dropout, the BNTH layout and FP8 are not in jax.nn.dot_product_attention: jax's own cuDNN entry point.
    from jax._src.cudnn import fused_attention_stablehlo as fmha

    batch, seq, heads, kv_heads, dim = 2, 256, 8, 2, 64
    btnh = jax.ShapeDtypeStruct((batch, seq, heads, dim), jnp.bfloat16)
    btnh_kv = jax.ShapeDtypeStruct((batch, seq, kv_heads, dim), jnp.bfloat16)
    bnth = jax.ShapeDtypeStruct((batch, heads, seq, dim), jnp.bfloat16)
    bnth_kv = jax.ShapeDtypeStruct((batch, kv_heads, seq, dim), jnp.bfloat16)
    bias = jax.ShapeDtypeStruct((1, heads, seq, seq), jnp.bfloat16)
    lengths = jax.ShapeDtypeStruct((batch,), jnp.int32)
    fp8 = jax.ShapeDtypeStruct((batch, seq, 4, 128), jnp.bfloat16)  # FP8 training: head dim 128
    scales = {key: jax.ShapeDtypeStruct((1, 1, 1, 1), jnp.float32) for key in fmha.fp8_params_keys}

    def nn(q, k, v, **options):
        return jax.nn.dot_product_attention(q, k, v, implementation="cudnn", **options)

    def fp8_attention(q, k, v, params):
        f8 = jnp.float8_e4m3fn
        out, _, _ = fmha.dot_product_attention(q.astype(f8), k.astype(f8), v.astype(f8), fp8_params=params,
                                               scale=0.125, mask_type=fmha.MaskType.CAUSAL, use_fp8=True)
        return out

    causal = fmha.MaskType.CAUSAL
    cases = {
        "fwd_nomask": (jax.jit(nn), (btnh, btnh_kv, btnh_kv)),
        "grad_nomask": (_grad_of(nn), (btnh, btnh_kv, btnh_kv)),
        "grad_bias": (_grad_of(lambda q, k, v, b: nn(q, k, v, bias=b, is_causal=True)), (btnh, btnh_kv, btnh_kv, bias)),
        "grad_padding": (_grad_of(lambda q, k, v, ql, kl: nn(q, k, v, is_causal=True, query_seq_lengths=ql,
                                                             key_value_seq_lengths=kl)),
                         (btnh, btnh_kv, btnh_kv, lengths, lengths)),
        "grad_window": (_grad_of(lambda q, k, v: nn(q, k, v, is_causal=True, local_window_size=(63, 0))),
                        (btnh, btnh_kv, btnh_kv)),
        "grad_bnth": (_grad_of(lambda q, k, v: fmha.dot_product_attention(q, k, v, scale=0.125, mask_type=causal,
                                                                           qkv_layout="BNTH")),
                      (bnth, bnth_kv, bnth_kv)),
        "grad_dropout": (_grad_of(lambda q, k, v: fmha.dot_product_attention(q, k, v, scale=0.125, mask_type=causal,
                                                                              dropout_rate=0.1)),
                         (btnh, btnh_kv, btnh_kv)),
        "fwd_fp8": (jax.jit(fp8_attention), (fp8, fp8, fp8, scales)),
        "grad_fp8": (_grad_of(fp8_attention), (fp8, fp8, fp8, scales)),
    }
    lowered: dict[str, object] = {}
    for name, (fn, args) in cases.items():
        try:
            lowered[name] = fn.lower(*args).as_text()
        except Exception as error:  # a form this jax or GPU cannot lower is recorded, not fatal
            lowered[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
        print(name, "lowered" if isinstance(lowered[name], str) else lowered[name], flush=True)
    return lowered


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    small = _inputs(2, 256, 8, 2, 64)
    cudnn = _attention("cudnn")
    (out / "cudnn_fmha_fwd.mlir").write_text(jax.jit(cudnn).lower(*small).as_text())
    (out / "cudnn_fmha_grad.mlir").write_text(_with_grad(cudnn).lower(*small).as_text())
    variants = {"jax": jax.__version__, "device": str(jax.devices()[0].device_kind), "cases": _variants()}
    (out / "cudnn_fmha_variants.json").write_text(json.dumps(variants, indent=1) + "\n")
    if "--lower-only" in sys.argv[2:]:
        return
    rows = []
    cases = [("cudnn", cudnn, (2, 8192, 64, 8, 128)), ("pallas_mha", _mha, (2, 8192, 64, 8, 128)),
             ("xla", _attention("xla"), (1, 4096, 64, 8, 128)), ("cudnn", cudnn, (1, 4096, 64, 8, 128))]
    for name, forward, shape in cases:
        batch, seq, heads, _, head_dim = shape
        flops = 2.0 * batch * heads * seq * seq * head_dim
        row = {"implementation": name, "batch": batch, "seq": seq, "heads": heads, "kv_heads": shape[3],
               "head_dim": head_dim, "causal": True, "dtype": "bf16", "forward_flops": flops,
               "backward_flops": 2.5 * flops}
        try:
            args = _inputs(*shape)
            row["forward_s"] = _timed(jax.jit(forward), *args)
            row["forward_backward_s"] = _timed(_with_grad(forward), *args)
        except Exception as error:  # a case that does not run on this machine is recorded, not fatal
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    document = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__,
                "date": datetime.date.today().isoformat(), "rows": rows}
    (out / "gpu_attention.json").write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
