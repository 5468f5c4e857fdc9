"""A Gemma-1-style decoder: one full training step with Adam, the paper's T2B and T7B.

Section 5.1 of the TOAST paper partitions "the 2B and 7B Gemma1 Transformer models",
"trained with Adam"; ``t2b`` and ``t7b`` build those steps, ``gemma_small`` a tiny one for
tests. As for ``toast.examples.gpt``, the step holds the forward pass, its backward pass
(``jax.value_and_grad``) and the optimizer update in one program:

    step(params, opt_state, tokens, targets) -> (loss, new_params, new_opt_state)

Forward pass (``B`` batch, ``S`` sequence, ``D`` model width, ``H`` query heads, ``K``
key/value heads (``K`` divides ``H``; ``K = 1`` is multi-query attention, ``K = H``
multi-head), ``Dh`` head width, ``F`` GeGLU hidden width, ``V`` vocabulary):

* ``h = embed[tokens] * sqrt(D)``: token embedding (``gather``; backward a ``scatter``-add)
  scaled as Gemma does; there is no position embedding (RoPE below).
* ``L`` pre-norm blocks, each ``h += attn(rms_norm(h))`` and ``h += mlp(rms_norm(h))``,
  with Gemma's RMSNorm ``x * rsqrt(mean(x * x) + eps) * (1 + scale)`` (``stablehlo.rsqrt``):

  - attention: ``q = einsum('bsd,dhk->bshk', x, wq)`` (``[B,S,H,Dh]``), ``k`` and ``v``
    likewise with ``wk, wv: [D,K,Dh]`` (``[B,S,K,Dh]``); rotary position embedding (RoPE,
    base 10000, Gemma's half-split form: ``[x1*cos - x2*sin, x2*cos + x1*sin]`` over the two
    halves of ``Dh``; the ``sine``/``cosine`` table of ``iota`` positions is built once per
    step and shared by the blocks) on ``q`` and ``k``; ``q``
    scaled by ``1/sqrt(Dh)``; ``k`` and ``v`` repeated to the ``H`` heads when ``K < H``
    (``broadcast_in_dim`` then ``reshape``, as ``jnp.repeat`` does; nothing when
    ``K = H``); scores ``einsum('bqhd,bkhd->bhqk')``, a causal mask (``iota``, ``compare``,
    ``select``), ``jax.nn.softmax``, ``einsum('bhqk,bkhd->bqhd')`` and the output
    projection ``einsum('bshk,hkd->bsd', out, wo)`` with ``wo: [H,Dh,D]``;
  - GeGLU MLP: ``(gelu(x @ w_gate) * (x @ w_up)) @ w_down`` (tanh GELU), ``w_gate, w_up:
    [D,F]``, ``w_down: [F,D]``; no biases anywhere.

* final RMSNorm, tied unembedding ``logits = h @ embed.T`` (``[B,S,V]``),
* softmax cross-entropy: ``jax.nn.log_softmax`` over ``V`` and ``take_along_axis`` of the
  integer targets (a ``gather``), averaged over ``B * S``.

Update: Adam written out in ``jnp`` (no optax), with ``b1 = 0.9``, ``b2 = 0.999``,
``eps = 1e-8``: ``t = step + 1``, ``mu = b1*mu + (1-b1)*g``, ``nu = b2*nu + (1-b2)*g*g``,
``p -= lr * (mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t)) + eps)`` (``stablehlo.power`` of
the step counter, ``stablehlo.sqrt``).

Parameters (``params``, a dict): ``embed: [V, D]``, ``final_norm: [D]`` and ``blocks``: with
``scan_layers=False`` a list of ``L`` dicts (argument names like
``params['blocks'][3]['wq']``); with ``scan_layers=True`` one dict whose leaves are stacked
along a leading ``L`` dimension (``params['blocks']['wq']: [L,D,H,Dh]``), consumed by
``jax.lax.scan`` (lowers to ``stablehlo.while``, once forward, once backward). Each block dict
holds ``attn_norm: [D], wq: [D,H,Dh], wk: [D,K,Dh], wv: [D,K,Dh], wo: [H,Dh,D],
mlp_norm: [D], w_gate: [D,F], w_up: [D,F], w_down: [F,D]``.

Optimizer state (``opt_state``, a dict): ``step: int32[]`` (steps taken so far), ``mu`` and
``nu``, the first and second moments, each shaped like ``params`` and of the parameters'
dtype (argument names like ``opt_state['mu']['blocks'][3]['wq']``).

Sizes (the paper's table; "hidden dim." there is the GeGLU width of the gate and up
projections together, ``2 * F``):

=====  ====  ==  ===============  ==  ==  ===  ======
model  D     L   F (paper's 2F)   H   K   Dh   V
=====  ====  ==  ===============  ==  ==  ===  ======
T2B    2048  18  16384 (32768)    8   1   256  256128
T7B    3072  28  24576 (49152)    16  16  256  256128
=====  ====  ==  ===============  ==  ==  ===  ======

``K = 1`` for T2B (Gemma-2B is multi-query), ``K = H`` for T7B (Gemma-7B is multi-head). The
paper gives no batch or sequence length for these runs beyond its sequence-scaling
experiments; ``t2b`` and ``t7b`` default to ``batch=8, seq=2048``, both overridable. About
2.51B parameters for T2B and 8.54B for T7B (the embedding is 0.52B and 0.79B of them).

Only shapes are built (``jax.ShapeDtypeStruct``), so sizes cost nothing until the program is
compiled; the op count depends only on ``layers``, ``scan_layers``, whether ``K < H`` and
the dtype (``bfloat16`` adds a few ``convert`` ops), not on the sizes.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["gemma_train_step", "gemma_small", "t2b", "t7b"]

_BLOCK_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")

ROPE_BASE = 10_000.0
RMS_EPS = 1e-6
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8


def check_sizes(*, layers: int, d_model: int, heads: int, head_dim: int, kv_heads: int) -> None:
    """Sizes a decoder of this family can have (shared with ``itx``): ``ValueError`` naming the first that
    cannot be."""
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} does not divide heads={heads}")
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even for the rotary embedding")
    if d_model < 1:
        raise ValueError(f"d_model must be positive, got {d_model}")


def _block_shapes(d_model: int, heads: int, kv_heads: int, head_dim: int,
                  d_ff: int) -> dict[str, tuple[int, ...]]:
    d = d_model
    return {
        "attn_norm": (d,),
        "wq": (d, heads, head_dim), "wk": (d, kv_heads, head_dim), "wv": (d, kv_heads, head_dim),
        "wo": (heads, head_dim, d),
        "mlp_norm": (d,),
        "w_gate": (d, d_ff), "w_up": (d, d_ff), "w_down": (d_ff, d),
    }


def _rms_norm(x, scale):
    # ``x * x`` rather than ``jnp.square``, which lowers to ``chlo.square``.
    mean_square = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(mean_square + RMS_EPS) * (1 + scale)


def _rope_table(seq: int, head_dim: int, dtype):
    """``(sin, cos)``, each ``[1, S, 1, Dh/2]``: the rotary angles ``position / 10000 **
    (2i / Dh)``, computed once per step (``iota``, ``power``, ``sine``, ``cosine``) and shared
    by every block's queries and keys."""
    fraction = 2 * jnp.arange(head_dim // 2, dtype=jnp.float32) / head_dim
    inverse_frequency = 1.0 / (ROPE_BASE ** fraction)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inverse_frequency[None, :]  # [S, Dh/2]
    return (jnp.sin(angles)[None, :, None, :].astype(dtype), jnp.cos(angles)[None, :, None, :].astype(dtype))


def _rope(x, rope):
    """Rotary position embedding of ``x: [B, S, N, Dh]`` over its sequence dim (Gemma's
    half-split form: the first and second halves of ``Dh`` are the rotated pairs)."""
    sin, cos = rope
    half = x.shape[3] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _repeat_heads(x, heads: int):
    """``[B, S, K, Dh]`` -> ``[B, S, H, Dh]``, each of the ``K`` heads used by ``H / K`` query
    heads in a row (``jnp.repeat`` on the heads dim: ``broadcast_in_dim`` and ``reshape``)."""
    batch, seq, kv_heads, head_dim = x.shape
    if kv_heads == heads:
        return x
    group = heads // kv_heads
    x = jnp.broadcast_to(x[:, :, :, None, :], (batch, seq, kv_heads, group, head_dim))
    return x.reshape(batch, seq, heads, head_dim)


def _attention(x, p, heads: int, rope):
    seq = x.shape[1]
    head_dim = p["wq"].shape[-1]
    q = _rope(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), rope) / math.sqrt(head_dim)
    k = _repeat_heads(_rope(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), rope), heads)
    v = _repeat_heads(jnp.einsum("bsd,dhk->bshk", x, p["wv"]), heads)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    return jnp.einsum("bshk,hkd->bsd", out, p["wo"])


def _mlp(x, p):
    return (jax.nn.gelu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def _block(h, p, heads: int, rope):
    h = h + _attention(_rms_norm(h, p["attn_norm"]), p, heads, rope)
    h = h + _mlp(_rms_norm(h, p["mlp_norm"]), p)
    return h


def gemma_train_step(*, layers: int, d_model: int, heads: int, kv_heads: int, head_dim: int,
                     d_ff: int, vocab: int, batch: int, seq: int, scan_layers: bool = False,
                     dtype=jnp.bfloat16, learning_rate: float = 1e-4):
    """Returns ``(fn, (params, opt_state, tokens, targets))`` for one Gemma training step.

    Args:
        layers: number of decoder blocks ``L``.
        d_model: ``D``, the residual width.
        heads: ``H``, query heads.
        kv_heads: ``K``, key/value heads; must divide ``heads`` (1: multi-query attention,
            ``heads``: multi-head attention, else grouped-query attention).
        head_dim: ``Dh``, the width of each head (even, for RoPE); need not be ``D / H``.
        d_ff: ``F``, the GeGLU hidden width of each of the gate and up projections.
        vocab: ``V``, vocabulary size (embedding rows, tied unembedding).
        batch: ``B``, sequences per step.
        seq: ``S``, tokens per sequence.
        scan_layers: stack the block parameters (and their Adam moments) and run them with
            ``jax.lax.scan`` (one ``stablehlo.while`` per direction) instead of unrolling.
        dtype: element type of the parameters and of the Adam moments.
        learning_rate: Adam step size, a constant of the program.

    ``fn(params, opt_state, tokens, targets)`` takes ``tokens, targets: int32[B, S]`` and
    ``opt_state = {'step': int32[], 'mu': like params, 'nu': like params}``, and returns
    ``(loss: dtype[], new_params, new_opt_state)`` shaped like its inputs.
    """
    check_sizes(layers=layers, d_model=d_model, heads=heads, head_dim=head_dim, kv_heads=kv_heads)

    def loss_fn(params, tokens, targets):
        h = params["embed"][tokens] * jnp.asarray(math.sqrt(d_model), dtype)
        rope = _rope_table(seq, head_dim, dtype)
        if scan_layers:
            def body(h, p):
                return _block(h, p, heads, rope), None
            h, _ = jax.lax.scan(body, h, params["blocks"])
        else:
            for p in params["blocks"]:
                h = _block(h, p, heads, rope)
        h = _rms_norm(h, params["final_norm"])
        logits = h @ params["embed"].T
        logp = jax.nn.log_softmax(logits, axis=-1)
        target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)
        return -jnp.mean(target_logp)

    def train_step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        step = opt_state["step"] + 1
        t = step.astype(jnp.float32)
        correction_1 = (1 - ADAM_B1 ** t).astype(dtype)  # bias corrections, stablehlo.power
        correction_2 = (1 - ADAM_B2 ** t).astype(dtype)
        mu = jax.tree_util.tree_map(lambda m, g: ADAM_B1 * m + (1 - ADAM_B1) * g, opt_state["mu"], grads)
        nu = jax.tree_util.tree_map(lambda n, g: ADAM_B2 * n + (1 - ADAM_B2) * (g * g), opt_state["nu"], grads)

        def update(p, m, n):
            return p - learning_rate * (m / correction_1) / (jnp.sqrt(n / correction_2) + ADAM_EPS)

        new_params = jax.tree_util.tree_map(update, params, mu, nu)
        return loss, new_params, {"step": step, "mu": mu, "nu": nu}

    def spec(shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    block_shapes = _block_shapes(d_model, heads, kv_heads, head_dim, d_ff)

    def parameter_shapes() -> dict[str, Any]:
        blocks: Any
        if scan_layers:
            blocks = {k: spec((layers,) + block_shapes[k]) for k in _BLOCK_KEYS}
        else:
            blocks = [{k: spec(block_shapes[k]) for k in _BLOCK_KEYS} for _ in range(layers)]
        return {"embed": spec((vocab, d_model)), "blocks": blocks, "final_norm": spec((d_model,))}

    params = parameter_shapes()
    opt_state = {"step": jax.ShapeDtypeStruct((), jnp.int32), "mu": parameter_shapes(), "nu": parameter_shapes()}
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    targets = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return train_step, (params, opt_state, tokens, targets)


def t2b(**overrides: Any):
    """The paper's T2B, Gemma-1 2B: D=2048, L=18, F=16384 per gate/up projection (the paper's
    "hidden dim." 32768 counts both), H=8 query heads, K=1 (multi-query), Dh=256, V=256128;
    B=8, S=2048 by default; bfloat16. Keywords of ``gemma_train_step`` override any of these."""
    settings: dict[str, Any] = dict(layers=18, d_model=2048, heads=8, kv_heads=1, head_dim=256, d_ff=16384,
                                    vocab=256128, batch=8, seq=2048)
    return gemma_train_step(**{**settings, **overrides})


def t7b(**overrides: Any):
    """The paper's T7B, Gemma-1 7B: D=3072, L=28, F=24576 per gate/up projection (the paper's
    "hidden dim." 49152 counts both), H=16 heads, K=16 (multi-head), Dh=256, V=256128;
    B=8, S=2048 by default; bfloat16. Keywords of ``gemma_train_step`` override any of these."""
    settings: dict[str, Any] = dict(layers=28, d_model=3072, heads=16, kv_heads=16, head_dim=256, d_ff=24576,
                                    vocab=256128, batch=8, seq=2048)
    return gemma_train_step(**{**settings, **overrides})


def gemma_small(**overrides: Any):
    """A tiny Gemma step for fast tests: L=2, D=64, H=4, K=1 (multi-query), Dh=16, F=128,
    V=256, B=4, S=16, float32. Keywords of ``gemma_train_step`` override any of these
    (``scan_layers=True`` for the scanned layout, ``kv_heads=2`` for grouped-query)."""
    settings: dict[str, Any] = dict(layers=2, d_model=64, heads=4, kv_heads=1, head_dim=16, d_ff=128, vocab=256,
                                    batch=4, seq=16, dtype=jnp.float32)
    return gemma_train_step(**{**settings, **overrides})
