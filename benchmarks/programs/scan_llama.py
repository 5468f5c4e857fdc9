"""A Llama-style decoder LM training step in plain JAX, written the way users write it for speed.

Nothing here is written for toast: the layer parameters are stacked along a leading layer dim
and run by one ``jax.lax.scan`` whose body is wrapped in ``jax.checkpoint`` (remat: the
backward pass recomputes each layer's activations instead of storing them), the loss is
optax's integer-label cross-entropy and the update ``optax.adam``:

    step(params, opt_state, tokens, targets) -> (loss, new_params, new_opt_state)

Forward pass (``B`` batch, ``S`` sequence, ``D`` model width, ``H`` query heads, ``K``
key/value heads (``K`` divides ``H``: grouped-query attention, ``G = H / K`` query heads per
key/value head), ``Dh = D / H``, ``F`` SwiGLU hidden width, ``V`` vocabulary, ``L`` layers):

* ``h = embed[tokens]`` (``gather``; backward a ``scatter``-add), no position embedding;
* ``jax.lax.scan`` over the ``L`` stacked layers (a ``stablehlo.while`` forward, another
  backward, where ``jax.checkpoint`` recomputes the layer), each
  ``h += attn(rms_norm(h))`` and ``h += mlp(rms_norm(h))`` with Llama's RMSNorm
  ``x * rsqrt(mean(x * x) + eps) * scale``:

  - attention: ``q = einsum('bsd,dhk->bshk', x, wq)`` (``[B,S,H,Dh]``), ``k`` and ``v``
    likewise with ``wk, wv: [D,K,Dh]``; rotary position embedding on ``q`` and ``k`` in
    Llama's ``rotate_half`` form (``x * cos + rotate_half(x) * sin``, the ``[S, Dh]`` tables
    built once per step, outside the scan); grouped-query attention without repeating
    ``k`` and ``v``: ``q`` reshaped to ``[B,S,K,G,Dh]``, scores
    ``einsum('bqkgd,bskd->bkgqs') / sqrt(Dh)``, a causal mask, ``jax.nn.softmax``,
    ``einsum('bkgqs,bskd->bqkgd')`` reshaped back to ``[B,S,H,Dh]`` and the output
    projection ``einsum('bshk,hkd->bsd', out, wo)`` with ``wo: [H,Dh,D]``;
  - SwiGLU MLP: ``(silu(x @ w_gate) * (x @ w_up)) @ w_down``, ``w_gate, w_up: [D,F]``,
    ``w_down: [F,D]``; no biases anywhere;

* final RMSNorm, untied LM head ``logits = h @ lm_head`` (``[B,S,V]``);
* loss: ``optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()``.

Update: ``optax.adam(3e-4)``; ``opt_state`` is optax's ``(ScaleByAdamState(count, mu, nu),
EmptyState())``, ``mu`` and ``nu`` shaped like ``params`` (argument names like
``opt_state[0].mu['layers']['wq']``).

Parameters (``params``, a dict): ``embed: [V, D]``, ``final_norm: [D]``, ``lm_head: [D, V]``
and ``layers``, a dict whose leaves are stacked along a leading ``L`` dim:
``attn_norm: [L,D], wq: [L,D,H,Dh], wk: [L,D,K,Dh], wv: [L,D,K,Dh], wo: [L,H,Dh,D],
mlp_norm: [L,D], w_gate: [L,D,F], w_up: [L,D,F], w_down: [L,F,D]`` (argument names like
``params['layers']['wq']``).

Sizes: the defaults are tiny (``L=2, D=64``) so that ``toast analyze`` takes seconds. The
benchmark size, a Llama-1B-like model (TinyLlama's ``D``, ``F`` and ``V``; 16 layers, 16
query heads of 128 and 8 key/value heads), is

    scan_llama(layers=16, d_model=2048, heads=16, kv_heads=8, ffn=5632, vocab=32000,
               seq=2048, batch=16)

(``toast analyze benchmarks.programs.scan_llama:scan_llama --arg layers=16 ...``): 886M
parameters (65.5M of them in the embedding and as many in the LM head). With the layers in a
scan the op count does not grow with ``layers``, nor with any width: every size lowers to
the default's 1268 ops.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

__all__ = ["scan_llama"]

ROPE_THETA = 10_000.0
RMS_EPS = 1e-5


def _rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * scale


def _rope_tables(seq: int, head_dim: int):
    """``(cos, sin)``, each ``[S, Dh]``: Llama's rotary angles ``position * theta ** (-2i / Dh)``
    for ``i < Dh / 2``, repeated for the two halves that ``_rotate_half`` pairs."""
    inverse_frequency = 1.0 / (ROPE_THETA ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inverse_frequency[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _apply_rope(x, cos, sin):
    """``x: [B, S, N, Dh]`` rotated by position (the tables broadcast over batch and heads)."""
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


def _attention(x, p, cos, sin):
    batch, seq, _ = x.shape
    _, heads, head_dim = p["wq"].shape
    kv_heads = p["wk"].shape[1]
    q = _apply_rope(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), cos, sin)
    k = _apply_rope(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), cos, sin)
    v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
    q = q.reshape(batch, seq, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(batch, seq, heads, head_dim)
    return jnp.einsum("bshk,hkd->bsd", out, p["wo"])


def _mlp(x, p):
    return (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]


def _decoder_layer(h, p, cos, sin):
    """One layer on the residual stream ``h: [B, S, D]``: attention, then the MLP, each on its RMSNorm."""
    h = h + _attention(_rms_norm(h, p["attn_norm"]), p, cos, sin)
    return h + _mlp(_rms_norm(h, p["mlp_norm"]), p)


def scan_llama(*, layers: int = 2, d_model: int = 64, heads: int = 4, kv_heads: int = 2, ffn: int = 128,
               vocab: int = 256, seq: int = 32, batch: int = 8, learning_rate: float = 3e-4):
    """Returns ``(fn, (params, opt_state, tokens, targets))`` for one Llama-style training step.

    Args:
        layers: ``L``, decoder layers (stacked, run by ``jax.lax.scan``).
        d_model: ``D``, the residual width; divisible by ``heads``.
        heads: ``H``, query heads (``Dh = D / H``, even for the rotary embedding).
        kv_heads: ``K``, key/value heads; divides ``heads``.
        ffn: ``F``, the SwiGLU hidden width of each of the gate and up projections.
        vocab: ``V``, vocabulary size (embedding rows, LM head columns).
        seq: ``S``, tokens per sequence.
        batch: ``B``, sequences per step.
        learning_rate: the Adam step size, a constant of the program.

    ``fn(params, opt_state, tokens, targets)`` takes ``tokens, targets: int32[B, S]``, the
    parameter dict (float32) and optax's Adam state, and returns ``(loss: float32[],
    new_params, new_opt_state)`` shaped like its inputs.
    """
    head_dim = _head_width(d_model, heads, kv_heads)
    optimizer = optax.adam(learning_rate)

    def loss_fn(params, tokens, targets):
        cos, sin = _rope_tables(seq, head_dim)

        @jax.checkpoint
        def layer(h, p):
            return _decoder_layer(h, p, cos, sin), None

        h = params["embed"][tokens]
        h, _ = jax.lax.scan(layer, h, params["layers"])
        logits = _rms_norm(h, params["final_norm"]) @ params["lm_head"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def init(key):
        keys = iter(jax.random.split(key, 9))

        def normal(*shape):
            return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

        return {
            "embed": normal(vocab, d_model),
            "layers": {
                "attn_norm": jnp.ones((layers, d_model), jnp.float32),
                "wq": normal(layers, d_model, heads, head_dim),
                "wk": normal(layers, d_model, kv_heads, head_dim),
                "wv": normal(layers, d_model, kv_heads, head_dim),
                "wo": normal(layers, heads, head_dim, d_model),
                "mlp_norm": jnp.ones((layers, d_model), jnp.float32),
                "w_gate": normal(layers, d_model, ffn),
                "w_up": normal(layers, d_model, ffn),
                "w_down": normal(layers, ffn, d_model),
            },
            "final_norm": jnp.ones((d_model,), jnp.float32),
            "lm_head": normal(d_model, vocab),
        }

    return _adam_step(loss_fn, init, optimizer, batch=batch, seq=seq)


def _head_width(d_model: int, heads: int, kv_heads: int) -> int:
    """``Dh = D / H``; a ``ValueError`` unless ``H`` divides ``D``, ``K`` divides ``H`` and ``Dh`` is even."""
    if d_model % heads or heads % kv_heads or (d_model // heads) % 2:
        raise ValueError(f"need heads | d_model, kv_heads | heads and an even head width; got d_model={d_model}, "
                         f"heads={heads}, kv_heads={kv_heads}")
    return d_model // heads


def _adam_step(loss_fn, init, optimizer, *, batch: int, seq: int):
    """``(train_step, (params, opt_state, tokens, targets))``: one ``optimizer`` step on ``loss_fn``'s
    gradient, with abstract arguments (``params`` shaped as ``init`` makes them; tokens ``int32[batch, seq]``)."""

    def train_step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return loss, params, opt_state

    params = jax.eval_shape(init, jax.random.PRNGKey(0))
    opt_state = jax.eval_shape(optimizer.init, params)
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    targets = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return train_step, (params, opt_state, tokens, targets)
