"""ITX, the paper's inference-optimized transformer: one decode step and one prefill step.

Section 5.1 of the TOAST paper serves "a 5B-parameters inference optimized transformer,
featuring ROPE and a KV cache" (after Pope et al., *Efficiently Scaling Transformer
Inference*), with vocabulary 50257, sequence length 1024, prompt length 1024, 32 heads,
32 layers, hidden dim 4096 and d_model 2048; its manual baseline combines multi-query
attention sharding, Megatron partitioning and data parallelism over the batch. This module
writes that model's two serving programs in plain JAX:

    decode(params, cache, position, tokens) -> (next_tokens, logits, new_cache)
    prefill(params, tokens) -> (next_tokens, logits, cache)

Sizes: ``B`` batch, ``T`` cache length, ``P`` prompt length, ``D`` model width, ``H`` query
heads, ``K`` key/value heads (``kv_heads``; 1 is multi-query attention), ``G = H / K``
query heads per key/value head, ``Dh`` head width, ``F`` MLP width, ``V`` vocabulary,
``L`` layers.

Decode, one autoregressive step for ``tokens: int32[B]`` at ``position: int32[]`` (one
position for the whole batch: every sequence has the same prompt length, as in the paper's
benchmark, so the cache is written with ``dynamic_update_slice`` rather than a scatter):

* ``h = wte[tokens]``: ``[B, D]`` (``gather``);
* ``L`` pre-norm blocks, each ``h += attn(rms_1(h))`` and ``h += mlp(rms_2(h))``:

  - RMSNorm ``x * rsqrt(mean(x * x) + eps) * scale``;
  - ``q = einsum('bd,dhk->bhk', x, wq)``: ``[B, H, Dh]``; ``k, v`` likewise with
    ``wk, wv: [D, K, Dh]``: ``[B, K, Dh]`` (multi-query: one key/value head shared by
    all query heads when ``K = 1``);
  - RoPE (rotate-half form, base 10000) on ``q`` and ``k`` at ``position``; the angles
    are computed in float32 (``sine``, ``cosine``) and cast to the element type;
  - ``cache_k = dynamic_update_slice(cache_k, k[:, None], (0, position, 0, 0))`` and the
    same for ``v``; each is ``[B, T, K, Dh]``;
  - ``q`` regrouped to ``[B, K, G, Dh]``; scores ``einsum('bngd,btnd->bngt')`` over the
    whole cache, scaled by ``1/sqrt(Dh)``, positions ``t > position`` masked (``iota``,
    ``compare``, ``select``), ``jax.nn.softmax`` over ``T``, ``einsum('bngt,btnd->bngd')``,
    back to ``[B, H, Dh]`` and projected by ``wo: [H, Dh, D]``;
  - MLP ``gelu(x @ w_fc) @ w_proj`` (tanh GELU), ``w_fc: [D, F]``, ``w_proj: [F, D]``;

* final RMSNorm, tied unembedding ``logits = h @ wte.T``: ``[B, V]``;
* greedy ``next_tokens = argmax(logits)``: ``int32[B]`` (a two-operand ``reduce``).

Prefill runs a prompt ``tokens: int32[B, P]`` through the same blocks with causal attention
over the prompt itself (RoPE at positions ``0 .. P-1``), and returns the cache holding the
prompt's keys and values at positions ``0 .. P-1`` (zero-padded to ``T``; ``stablehlo.pad``),
the logits of the last prompt position ``[B, V]`` and their argmax, the first generated
token, which the decode step takes next at ``position = P``.

Like the model it follows, the blocks have no biases (RMSNorm has a scale only).

Parameters (``params``, a dict): ``wte: [V, D]``, ``ln_f_scale: [D]`` and ``blocks``; each
block dict holds ``ln_1_scale, wq, wk, wv, wo, ln_2_scale, w_fc, w_proj``. The cache is the
same per layer: ``{'k', 'v'}`` of ``[B, T, K, Dh]``. With ``scan_layers=False`` both are lists
of ``L`` dicts (argument names like ``params['blocks'][3]['wq']`` and ``cache[3]['k']``); with
``scan_layers=True`` each is one dict whose leaves are stacked along a leading ``L`` dim
(``params['blocks']['wq']: [L, D, H, Dh]``, ``cache['k']: [L, B, T, K, Dh]``), run by
``jax.lax.scan`` (one ``stablehlo.while``).

Paper sizes (``itx``, ``itx_prefill``): ``L = 32``, ``H = 32``, ``D = 2048``,
``Dh = D / H = 64``, ``F = 4096`` (the paper's "hidden dim."), ``K = 1``, ``B = 32``,
``P = 1024`` and ``T = 2048``: the paper's 1024-token prompt followed by up to 1024
generated tokens (its "sequence length"), all in one cache. The vocabulary is padded from
GPT-2's 50257 tokens (odd, so it shards over no even mesh axis) to ``V = 50304``, a multiple
of 128, as ``toast/examples/gpt.py`` does; the 47 padding rows are never real tokens (a
trained model keeps their logits low).

Parameter count at those sizes: per block ``wq`` and ``wo`` 2048 * 32 * 64 = 4,194,304 each,
``wk`` and ``wv`` 2048 * 64 = 131,072 each, ``w_fc`` and ``w_proj`` 2048 * 4096 = 8,388,608
each, two norm scales of 2048: 25,432,064 per block, 813,826,048 for 32 blocks; ``wte``
50304 * 2048 = 103,022,592; ``ln_f_scale`` 2048. Total **916,850,688** (about 0.92B; 916,754,432
with the unpadded vocabulary). That is far from the paper's "5B": its listed sizes give
0.92B with multi-query attention and 1,176,897,536 (1.18B) even with full multi-head
attention (``kv_heads=32``). We keep the paper's sizes, not its parameter count.

Only shapes are built (``jax.ShapeDtypeStruct``), so the sizes cost nothing until the program
is compiled; the op count depends only on ``layers`` and ``scan_layers``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from toast.examples.gemma import check_sizes

__all__ = [
    "itx_decode_step", "itx_prefill_step",
    "itx", "itx_prefill", "itx_small", "itx_prefill_small",
]

_BLOCK_KEYS = ("ln_1_scale", "wq", "wk", "wv", "wo", "ln_2_scale", "w_fc", "w_proj")

# The paper's sizes (section 5.1); vocab padded 50257 -> 50304, cache = prompt + generated.
_PAPER = dict(layers=32, d_model=2048, heads=32, head_dim=64, d_ff=4096, vocab=50304,
              batch=32, cache_length=2048)
_PAPER_PROMPT = 1024
# Tiny sizes for tests: every role dim (B=2, H=4, F=128, V=128) divides by 2.
_SMALL = dict(layers=2, d_model=64, heads=4, head_dim=16, d_ff=128, vocab=128,
              batch=2, cache_length=16)
_SMALL_PROMPT = 8

_ROPE_BASE = 10000.0


def _block_shapes(d_model: int, heads: int, kv_heads: int, head_dim: int, d_ff: int
                  ) -> dict[str, tuple[int, ...]]:
    d = d_model
    return {
        "ln_1_scale": (d,),
        "wq": (d, heads, head_dim),
        "wk": (d, kv_heads, head_dim),
        "wv": (d, kv_heads, head_dim),
        "wo": (heads, head_dim, d),
        "ln_2_scale": (d,),
        "w_fc": (d, d_ff),
        "w_proj": (d_ff, d),
    }


def _rms_norm(x, scale, eps: float = 1e-6):
    # ``x * x`` rather than ``jnp.square``, which lowers to ``chlo.square``.
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _rope(x, positions):
    """Rotary embedding (rotate-half form) of ``x: [..., Dh]`` at ``positions``, an array that
    broadcasts against ``x.shape[:-1]`` once given a trailing axis (a scalar for decode)."""
    half = x.shape[-1] // 2
    inv_freq = jnp.asarray(_ROPE_BASE ** (-np.arange(half, dtype=np.float32) / half))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _mlp(x, p):
    return jax.nn.gelu(x @ p["w_fc"]) @ p["w_proj"]


def _decode_block(h, p, layer_cache, position, kv_heads: int):
    """One block for one token per sequence: ``h: [B, D]``; returns ``(h, new layer cache)``."""
    batch = h.shape[0]
    heads, head_dim = p["wq"].shape[1:]
    x = _rms_norm(h, p["ln_1_scale"])
    q = _rope(jnp.einsum("bd,dhk->bhk", x, p["wq"]), position)
    k = _rope(jnp.einsum("bd,dnk->bnk", x, p["wk"]), position)
    v = jnp.einsum("bd,dnk->bnk", x, p["wv"])
    zero = jnp.zeros((), jnp.int32)
    start = (zero, position, zero, zero)
    cache_k = jax.lax.dynamic_update_slice(layer_cache["k"], k[:, None], start)
    cache_v = jax.lax.dynamic_update_slice(layer_cache["v"], v[:, None], start)
    q = q.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("bngd,btnd->bngt", q, cache_k) / math.sqrt(head_dim)
    seen = jnp.arange(cache_k.shape[1]) <= position
    scores = jnp.where(seen, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bngt,btnd->bngd", weights, cache_v).reshape(batch, heads, head_dim)
    h = h + jnp.einsum("bhk,hkd->bd", out, p["wo"])
    h = h + _mlp(_rms_norm(h, p["ln_2_scale"]), p)
    return h, {"k": cache_k, "v": cache_v}


def _prefill_block(h, p, cache_length: int, kv_heads: int):
    """One block over the prompt: ``h: [B, P, D]``; returns ``(h, layer cache)`` with the
    prompt's keys and values at positions ``0 .. P-1`` of ``[B, T, K, Dh]``."""
    batch, prompt, _ = h.shape
    heads, head_dim = p["wq"].shape[1:]
    positions = jnp.arange(prompt)
    x = _rms_norm(h, p["ln_1_scale"])
    q = _rope(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), positions[:, None])
    k = _rope(jnp.einsum("bsd,dnk->bsnk", x, p["wk"]), positions[:, None])
    v = jnp.einsum("bsd,dnk->bsnk", x, p["wv"])
    q = q.reshape(batch, prompt, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("bqngd,bknd->bngqk", q, k) / math.sqrt(head_dim)
    causal = positions[:, None] >= positions[None, :]
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bngqk,bknd->bqngd", weights, v).reshape(batch, prompt, heads, head_dim)
    h = h + jnp.einsum("bshk,hkd->bsd", out, p["wo"])
    h = h + _mlp(_rms_norm(h, p["ln_2_scale"]), p)
    pad = ((0, 0), (0, cache_length - prompt), (0, 0), (0, 0))
    return h, {"k": jnp.pad(k, pad), "v": jnp.pad(v, pad)}


def _head(h, params):
    """Final norm, tied unembedding and greedy choice: ``h: [B, D]`` -> ``(int32[B], [B, V])``."""
    logits = _rms_norm(h, params["ln_f_scale"]) @ params["wte"].T
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), logits


def _param_specs(*, layers: int, d_model: int, heads: int, kv_heads: int, head_dim: int, d_ff: int,
                 vocab: int, scan_layers: bool, dtype) -> dict[str, Any]:
    def spec(shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    shapes = _block_shapes(d_model, heads, kv_heads, head_dim, d_ff)
    blocks: Any
    if scan_layers:
        blocks = {k: spec((layers,) + shapes[k]) for k in _BLOCK_KEYS}
    else:
        blocks = [{k: spec(shapes[k]) for k in _BLOCK_KEYS} for _ in range(layers)]
    return {"wte": spec((vocab, d_model)), "blocks": blocks, "ln_f_scale": spec((d_model,))}


def itx_decode_step(*, layers: int = 32, d_model: int = 2048, heads: int = 32, head_dim: int = 64,
                    d_ff: int = 4096, vocab: int = 50304, batch: int = 32, cache_length: int = 2048,
                    kv_heads: int = 1, scan_layers: bool = False, dtype=jnp.bfloat16):
    """Returns ``(fn, (params, cache, position, tokens))`` for one ITX decode step.

    Args:
        layers: number of transformer blocks ``L``.
        d_model: ``D``, the residual width.
        heads: ``H``, query heads.
        head_dim: ``Dh``, the width of each head (even, for RoPE); ``D / H`` in the paper.
        d_ff: ``F``, the MLP hidden width.
        vocab: ``V``, vocabulary size (embedding rows, tied unembedding).
        batch: ``B``, sequences decoded together.
        cache_length: ``T``, positions the KV cache holds (prompt plus generated tokens).
        kv_heads: ``K``, key/value heads; 1 (the default) is multi-query attention, ``H``
            plain multi-head attention; must divide ``heads``.
        scan_layers: stack the block parameters and the cache along a leading ``L`` dim and
            run the blocks with ``jax.lax.scan`` (one ``stablehlo.while``).
        dtype: element type of the parameters, the cache and the activations.

    ``fn(params, cache, position, tokens)`` takes ``position: int32[]`` (the cache slot the
    new tokens take, the same for every sequence; ``0 <= position < T``) and
    ``tokens: int32[B]``, and returns ``(next_tokens: int32[B], logits: dtype[B, V],
    new_cache)``, ``new_cache`` shaped like ``cache``.
    """
    check_sizes(layers=layers, d_model=d_model, heads=heads, head_dim=head_dim, kv_heads=kv_heads)

    def decode_step(params, cache, position, tokens):
        h = params["wte"][tokens]
        if scan_layers:
            def body(h, xs):
                p, layer_cache = xs
                return _decode_block(h, p, layer_cache, position, kv_heads)
            h, new_cache = jax.lax.scan(body, h, (params["blocks"], cache))
        else:
            new_cache = []
            for p, layer_cache in zip(params["blocks"], cache, strict=True):
                h, layer_cache = _decode_block(h, p, layer_cache, position, kv_heads)
                new_cache.append(layer_cache)
        next_tokens, logits = _head(h, params)
        return next_tokens, logits, new_cache

    params = _param_specs(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads,
                          head_dim=head_dim, d_ff=d_ff, vocab=vocab, scan_layers=scan_layers, dtype=dtype)
    layer_shape = (batch, cache_length, kv_heads, head_dim)
    cache: Any
    if scan_layers:
        cache = {k: jax.ShapeDtypeStruct((layers,) + layer_shape, dtype) for k in ("k", "v")}
    else:
        cache = [{k: jax.ShapeDtypeStruct(layer_shape, dtype) for k in ("k", "v")} for _ in range(layers)]
    position = jax.ShapeDtypeStruct((), jnp.int32)
    tokens = jax.ShapeDtypeStruct((batch,), jnp.int32)
    return decode_step, (params, cache, position, tokens)


def itx_prefill_step(*, layers: int = 32, d_model: int = 2048, heads: int = 32, head_dim: int = 64,
                     d_ff: int = 4096, vocab: int = 50304, batch: int = 32, prompt_length: int = 1024,
                     cache_length: int = 2048, kv_heads: int = 1, scan_layers: bool = False,
                     dtype=jnp.bfloat16):
    """Returns ``(fn, (params, tokens))`` for the ITX prefill of a prompt.

    Args are those of ``itx_decode_step``, plus ``prompt_length``: ``P``, prompt tokens per
    sequence, at most ``cache_length``.

    ``fn(params, tokens)`` takes ``tokens: int32[B, P]`` and returns ``(next_tokens: int32[B],
    logits: dtype[B, V], cache)``: the logits of the last prompt position and their argmax,
    and the cache (``{'k', 'v'}`` of ``[B, T, K, Dh]`` per layer, a list of dicts or, with
    ``scan_layers``, stacked) holding the prompt at positions ``0 .. P-1`` and zeros after,
    ready for ``itx_decode_step``'s ``fn`` at ``position = P``.
    """
    check_sizes(layers=layers, d_model=d_model, heads=heads, head_dim=head_dim, kv_heads=kv_heads)
    if not 1 <= prompt_length <= cache_length:
        raise ValueError(f"prompt_length={prompt_length} must be in 1..cache_length={cache_length}")

    def prefill_step(params, tokens):
        h = params["wte"][tokens]
        if scan_layers:
            def body(h, p):
                return _prefill_block(h, p, cache_length, kv_heads)
            h, cache = jax.lax.scan(body, h, params["blocks"])
        else:
            cache = []
            for p in params["blocks"]:
                h, layer_cache = _prefill_block(h, p, cache_length, kv_heads)
                cache.append(layer_cache)
        next_tokens, logits = _head(h[:, -1], params)
        return next_tokens, logits, cache

    params = _param_specs(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads,
                          head_dim=head_dim, d_ff=d_ff, vocab=vocab, scan_layers=scan_layers, dtype=dtype)
    tokens = jax.ShapeDtypeStruct((batch, prompt_length), jnp.int32)
    return prefill_step, (params, tokens)


def itx(**overrides):
    """The paper's ITX decode step: L=32, H=32, D=2048, Dh=64, F=4096, K=1 (multi-query),
    V=50304 (50257 padded), B=32, T=2048 (1024 prompt + 1024 generated), bfloat16; 916,850,688
    parameters. Keywords override ``itx_decode_step``'s settings (``scan_layers=True``, ...)."""
    return itx_decode_step(**{**_PAPER, **overrides})


def itx_prefill(**overrides):
    """The paper's ITX prefill: ``itx``'s sizes with a 1024-token prompt (P=1024, T=2048).
    Keywords override ``itx_prefill_step``'s settings."""
    return itx_prefill_step(**{**_PAPER, "prompt_length": _PAPER_PROMPT, **overrides})


def itx_small(**overrides):
    """A tiny ITX decode step for tests: L=2, D=64, H=4, Dh=16, F=128, K=1, V=128, B=2, T=16,
    bfloat16. Keywords override ``itx_decode_step``'s settings."""
    return itx_decode_step(**{**_SMALL, **overrides})


def itx_prefill_small(**overrides):
    """``itx_small``'s sizes as a prefill of an 8-token prompt (P=8, T=16). Keywords override
    ``itx_prefill_step``'s settings."""
    return itx_prefill_step(**{**_SMALL, "prompt_length": _SMALL_PROMPT, **overrides})
