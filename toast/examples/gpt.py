"""A GPT-2-style decoder-only transformer: one full training step.

The step is what a sharding tool really has to partition: the forward pass, its
backward pass (from ``jax.value_and_grad``) and the parameter update, all in one
program.

    step(params, tokens, targets) -> (loss, new_params)

Forward pass (``B`` batch, ``S`` sequence, ``D`` model width, ``H`` heads,
``Dh = D / H``, ``F`` MLP width, ``V`` vocabulary):

* ``h = wte[tokens] + wpe``: token embedding (``gather``) plus learned position
  embedding; backward turns the gather into a ``scatter``-add.
* ``L`` pre-LayerNorm blocks, each
  ``h += attn(ln_1(h))`` and ``h += mlp(ln_2(h))``:

  - attention: ``q, k, v = x @ w + b`` (``[B,S,D]``), reshaped to
    ``[B,S,H,Dh]``, scores ``einsum('bqhd,bkhd->bhqk')`` scaled by
    ``1/sqrt(Dh)``, a causal mask (``iota``, ``compare``, ``select``),
    ``jax.nn.softmax``, ``einsum('bhqk,bkhd->bqhd')``, merged back to
    ``[B,S,D]`` and projected by ``wo``;
  - MLP: ``gelu(x @ w_fc + b_fc) @ w_proj + b_proj`` (tanh GELU).

* final LayerNorm, tied unembedding ``logits = h @ wte.T``,
* cross-entropy: ``jax.nn.log_softmax`` over ``V`` and ``take_along_axis`` of the
  integer targets (a ``gather``), averaged over ``B * S``.

Update: plain SGD, ``p - learning_rate * g`` over the whole parameter tree.

Parameters (``params``, a dict):

* ``wte: [V, D]``, ``wpe: [S, D]``, ``ln_f: {scale, bias}: [D]``;
* ``blocks``: with ``scan_layers=False`` a list of ``L`` dicts (argument names
  like ``params['blocks'][3]['wq']``); with ``scan_layers=True`` one dict whose
  leaves are stacked along a leading ``L`` dimension, consumed by
  ``jax.lax.scan`` (lowers to ``stablehlo.while``, once forward, once backward).

Each block dict holds ``ln_1_scale, ln_1_bias, wq, bq, wk, bk, wv, bv, wo, bo,
ln_2_scale, ln_2_bias, w_fc, b_fc, w_proj, b_proj``.

Default sizes are GPT-2 small (12 heads of 64 over ``d_model=768``,
``d_ff=3072``) with ``vocab=50304``: GPT-2's 50257 tokens padded to a multiple
of 128, as is usual, so that the vocabulary dimension can be sharded evenly.
Only shapes are built (``jax.ShapeDtypeStruct``), so sizes cost nothing until
the program is compiled; the op count depends only on ``layers`` and
``scan_layers``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["gpt_train_step", "gpt_small", "gpt_scan"]

_BLOCK_KEYS = (
    "ln_1_scale", "ln_1_bias",
    "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo",
    "ln_2_scale", "ln_2_bias",
    "w_fc", "b_fc", "w_proj", "b_proj",
)


def _block_shapes(d_model: int, d_ff: int) -> dict[str, tuple[int, ...]]:
    d = d_model
    return {
        "ln_1_scale": (d,), "ln_1_bias": (d,),
        "wq": (d, d), "bq": (d,),
        "wk": (d, d), "bk": (d,),
        "wv": (d, d), "bv": (d,),
        "wo": (d, d), "bo": (d,),
        "ln_2_scale": (d,), "ln_2_bias": (d,),
        "w_fc": (d, d_ff), "b_fc": (d_ff,),
        "w_proj": (d_ff, d), "b_proj": (d,),
    }


def _layer_norm(x, scale, bias, eps: float = 1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    # ``centered * centered`` rather than ``jnp.square``, which lowers to ``chlo.square``.
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * jax.lax.rsqrt(var + eps) * scale + bias


def _attention(x, p, heads: int):
    batch, seq, d_model = x.shape
    head_dim = d_model // heads
    q = (x @ p["wq"] + p["bq"]).reshape(batch, seq, heads, head_dim)
    k = (x @ p["wk"] + p["bk"]).reshape(batch, seq, heads, head_dim)
    v = (x @ p["wv"] + p["bv"]).reshape(batch, seq, heads, head_dim)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, d_model)
    return out @ p["wo"] + p["bo"]


def _mlp(x, p):
    return jax.nn.gelu(x @ p["w_fc"] + p["b_fc"]) @ p["w_proj"] + p["b_proj"]


def _block(h, p, heads: int):
    h = h + _attention(_layer_norm(h, p["ln_1_scale"], p["ln_1_bias"]), p, heads)
    h = h + _mlp(_layer_norm(h, p["ln_2_scale"], p["ln_2_bias"]), p)
    return h


def gpt_train_step(*, layers: int = 2, batch: int = 8, seq: int = 128, d_model: int = 768,
                   heads: int = 12, vocab: int = 50304, d_ff: int | None = None,
                   scan_layers: bool = False, learning_rate: float = 1e-3,
                   dtype=jnp.float32):
    """Returns ``(fn, (params, tokens, targets))`` for one GPT training step.

    Args:
        layers: number of transformer blocks ``L``.
        batch: ``B``, sequences per step.
        seq: ``S``, tokens per sequence (also the length of ``wpe``).
        d_model: ``D``, the residual width; must be divisible by ``heads``.
        heads: ``H``, attention heads (``Dh = D / H``).
        vocab: ``V``, vocabulary size (embedding rows, tied unembedding).
        d_ff: ``F``, MLP hidden width; ``None`` means ``4 * d_model``.
        scan_layers: stack the block parameters and run them with ``jax.lax.scan``
            (one ``stablehlo.while`` per direction) instead of unrolling.
        learning_rate: SGD step size, a constant of the program.
        dtype: element type of the parameters.

    ``fn(params, tokens, targets)`` takes ``tokens, targets: int32[B, S]`` and returns
    ``(loss: dtype[], new_params)`` with ``new_params`` shaped like ``params``.
    """
    if d_model % heads:
        raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    if d_ff is None:
        d_ff = 4 * d_model

    def loss_fn(params, tokens, targets):
        h = params["wte"][tokens] + params["wpe"]
        if scan_layers:
            def body(h, p):
                return _block(h, p, heads), None
            h, _ = jax.lax.scan(body, h, params["blocks"])
        else:
            for p in params["blocks"]:
                h = _block(h, p, heads)
        h = _layer_norm(h, params["ln_f"]["scale"], params["ln_f"]["bias"])
        logits = h @ params["wte"].T
        logp = jax.nn.log_softmax(logits, axis=-1)
        target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)
        return -jnp.mean(target_logp)

    def train_step(params, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        new_params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
        return loss, new_params

    def spec(shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    block_shapes = _block_shapes(d_model, d_ff)
    blocks: Any
    if scan_layers:
        blocks = {k: spec((layers,) + block_shapes[k]) for k in _BLOCK_KEYS}
    else:
        blocks = [{k: spec(block_shapes[k]) for k in _BLOCK_KEYS} for _ in range(layers)]
    params = {
        "wte": spec((vocab, d_model)),
        "wpe": spec((seq, d_model)),
        "blocks": blocks,
        "ln_f": {"scale": spec((d_model,)), "bias": spec((d_model,))},
    }
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    targets = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return train_step, (params, tokens, targets)


def gpt_small(*, layers: int = 2, batch: int = 2, seq: int = 16, d_model: int = 64, heads: int = 4, vocab: int = 128,
              scan_layers: bool = False):
    """A tiny GPT step for fast tests: B=2, S=16, D=64, H=4, V=128, F=4D=256 (each size can be given:
    ``gpt_small?batch=8`` for a batch a 4- or 8-way data axis divides)."""
    return gpt_train_step(layers=layers, batch=batch, seq=seq, d_model=d_model, heads=heads, vocab=vocab,
                          scan_layers=scan_layers)


def gpt_scan(*, layers: int = 2):
    """``gpt_small`` with the blocks run by ``jax.lax.scan`` (``stablehlo.while``)."""
    return gpt_small(layers=layers, scan_layers=True)
