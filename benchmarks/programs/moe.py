"""A top-2 mixture-of-experts transformer language model in plain JAX: one Adam training step.

Every block's feed-forward layer is a GShard-style mixture of experts: a router picks two
experts per token, tokens are dispatched into fixed-size per-expert buffers with one-hot
einsums (tokens past an expert's capacity are dropped), the experts run as one batched einsum
over their stacked weights, and the outputs are combined back with the gate weights.

    step(params, opt_state, inputs, targets) -> (loss, new_params, new_opt_state)

Forward pass (``B`` batch, ``S`` sequence, ``D`` model width, ``H`` heads, ``Dh = D / H``,
``E`` experts, ``F`` expert hidden width, ``C`` expert capacity, ``V`` vocabulary, ``L``
layers):

* ``h = embed[inputs] + pos_embed`` (a ``gather``);
* ``L`` pre-RMSNorm blocks, ``h += attn(norm_1(h))``, ``h += moe(norm_2(h))``:

  - attention: ``q, k, v = x @ wq, x @ wk, x @ wv`` reshaped to ``[B, S, H, Dh]``, scores
    ``einsum('bqhd,bkhd->bhqk') / sqrt(Dh)``, a causal mask, ``jax.nn.softmax``,
    ``einsum('bhqk,bkhd->bqhd')``, merged and projected by ``wo``;
  - mixture of experts, each sequence one group of ``S`` tokens (GShard's groups):
    router logits ``einsum('gsd,de->gse', x, router)``; ``jax.lax.top_k(logits, 2)``; the two
    gates a ``softmax`` over the two chosen logits; each token's slot in its expert's buffer
    from a ``cumsum`` of the one-hot choices (first choices before second choices), kept when
    below the capacity ``C = ceil(capacity_factor * 2 * S / E)``; ``combine [G, S, E, C]``
    (gate times one-hot expert times one-hot slot) and ``dispatch = combine > 0``;
    ``expert_in = einsum('gsec,gsd->egcd', dispatch, x)``, ``gelu(einsum('egcd,edf->egcf',
    expert_in, w_in))``, ``einsum('egcf,efd->egcd', ., w_out)``, and back with
    ``einsum('gsec,egcd->gsd', combine, .)``; a load-balancing loss ``E^2 * mean(fraction of
    first choices * mean router probability)`` per layer;

* final RMSNorm, an untied ``unembed [D, V]``;
* loss: ``optax.softmax_cross_entropy_with_integer_labels`` averaged over ``B * S``, plus
  ``aux_weight`` times the load-balancing losses summed over the layers.

Update: ``jax.value_and_grad``, then ``optax.adam`` (``tx.update``, ``optax.apply_updates``).

Parameters (``params``, a dict): ``embed [V, D]``, ``pos_embed [S, D]``, ``norm_f [D]``,
``unembed [D, V]`` and ``blocks``, a list of ``L`` dicts (argument names like
``params['blocks'][0]['w_in']``) each holding ``norm_1 [D]``, ``wq, wk, wv, wo [D, D]``,
``norm_2 [D]``, ``router [D, E]``, ``w_in [E, D, F]``, ``w_out [E, F, D]``.

Default sizes are small, so that ``toast analyze`` takes seconds: ``L=2, B=8, S=32, D=64, H=8,
E=4, F=128, V=256``, capacity factor 1.25 (``C=20``). The benchmark size is GPT-2-small shaped
with eight experts::

    moe(layers=12, d_model=768, heads=12, experts=8, d_ff=3072, seq=1024, batch=16, vocab=50304)

Only shapes are built (``jax.eval_shape``): sizes cost nothing until the program is compiled,
and the op count depends only on ``layers``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

__all__ = ["moe"]


def _rms_norm(x, scale, eps: float = 1e-6):
    mean_square = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(mean_square + eps) * scale


def _attention(x, p, heads: int):
    batch, seq, d_model = x.shape
    head_dim = d_model // heads
    q = (x @ p["wq"]).reshape(batch, seq, heads, head_dim)
    k = (x @ p["wk"]).reshape(batch, seq, heads, head_dim)
    v = (x @ p["wv"]).reshape(batch, seq, heads, head_dim)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, d_model)
    return out @ p["wo"]


def _top2_moe(x, p, capacity: int):
    """GShard top-2 mixture of experts over groups ``x [G, S, D]``; returns ``(y, aux_loss)``."""
    experts = p["router"].shape[1]
    logits = jnp.einsum("gsd,de->gse", x, p["router"])
    probs = jax.nn.softmax(logits, axis=-1)
    top_logits, top_experts = jax.lax.top_k(logits, 2)           # [G, S, 2]
    gates = jax.nn.softmax(top_logits, axis=-1)                  # [G, S, 2]
    mask_1 = jax.nn.one_hot(top_experts[..., 0], experts, dtype=x.dtype)  # [G, S, E]
    mask_2 = jax.nn.one_hot(top_experts[..., 1], experts, dtype=x.dtype)
    # Slot of each token in its expert's buffer: the first choices of the group, then the second.
    slot_1 = jnp.cumsum(mask_1, axis=1) - 1.0
    slot_2 = jnp.cumsum(mask_2, axis=1) - 1.0 + jnp.sum(mask_1, axis=1, keepdims=True)
    kept_1 = mask_1 * (slot_1 < capacity)
    kept_2 = mask_2 * (slot_2 < capacity)
    slot_1 = jnp.sum(slot_1 * kept_1, axis=-1).astype(jnp.int32)  # [G, S]
    slot_2 = jnp.sum(slot_2 * kept_2, axis=-1).astype(jnp.int32)
    combine = (gates[..., 0, None, None] * kept_1[..., None]
               * jax.nn.one_hot(slot_1, capacity, dtype=x.dtype)[:, :, None, :]
               + gates[..., 1, None, None] * kept_2[..., None]
               * jax.nn.one_hot(slot_2, capacity, dtype=x.dtype)[:, :, None, :])  # [G, S, E, C]
    dispatch = (combine > 0).astype(x.dtype)
    expert_in = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    hidden = jax.nn.gelu(jnp.einsum("egcd,edf->egcf", expert_in, p["w_in"]))
    expert_out = jnp.einsum("egcf,efd->egcd", hidden, p["w_out"])
    y = jnp.einsum("gsec,egcd->gsd", combine, expert_out)
    # Load balancing (GShard, Switch): fraction of first choices per expert times mean probability.
    fraction = jnp.mean(mask_1, axis=1)
    mean_prob = jnp.mean(probs, axis=1)
    aux_loss = jnp.mean(fraction * mean_prob) * experts * experts
    return y, aux_loss


def _block(h, p, heads: int, capacity: int):
    h = h + _attention(_rms_norm(h, p["norm_1"]), p, heads)
    y, aux_loss = _top2_moe(_rms_norm(h, p["norm_2"]), p, capacity)
    return h + y, aux_loss


def moe(*, layers: int = 2, batch: int = 8, seq: int = 32, d_model: int = 64, heads: int = 8,
        experts: int = 4, d_ff: int = 128, vocab: int = 256, capacity_factor: float = 1.25,
        aux_weight: float = 0.01, learning_rate: float = 3e-4, dtype=jnp.float32):
    """Returns ``(fn, (params, opt_state, inputs, targets))`` for one top-2 MoE LM Adam step.

    Args:
        layers: number of transformer blocks ``L``, each with a mixture-of-experts MLP.
        batch: ``B``, sequences per step (each one routing group).
        seq: ``S``, tokens per sequence (also the rows of ``pos_embed``).
        d_model: ``D``, the residual width; must be divisible by ``heads``.
        heads: ``H``, attention heads (``Dh = D / H``).
        experts: ``E``, experts per layer (at least 2).
        d_ff: ``F``, each expert's hidden width.
        vocab: ``V``, vocabulary size.
        capacity_factor: expert buffer size over the even share of the ``2 S`` choices of a
            group: ``C = ceil(capacity_factor * 2 * S / E)``.
        aux_weight: weight of the load-balancing loss.
        learning_rate: Adam step size, a constant of the program.
        dtype: element type of the parameters.

    Arguments of ``fn``:

    * ``params``: see the module docstring; the experts' weights are stacked,
      ``w_in [E, D, F]`` and ``w_out [E, F, D]``;
    * ``opt_state``: ``optax.adam``'s state, ``(ScaleByAdamState(count: int32[], mu, nu),
      EmptyState())`` with ``mu`` and ``nu`` shaped like ``params``;
    * ``inputs``, ``targets``: ``int32[B, S]`` (the tokens and the next tokens).

    ``fn`` returns ``(loss: dtype[], new_params, new_opt_state)``.
    """
    if d_model % heads:
        raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    if experts < 2:
        raise ValueError(f"top-2 routing needs at least 2 experts, got {experts}")
    capacity = math.ceil(capacity_factor * 2 * seq / experts)

    def init(key):
        keys = iter(jax.random.split(key, 4 + 7 * layers))

        def normal(shape, fan_in):
            return jax.random.normal(next(keys), shape, dtype) / math.sqrt(fan_in)

        def block():
            return {
                "norm_1": jnp.ones((d_model,), dtype),
                "wq": normal((d_model, d_model), d_model),
                "wk": normal((d_model, d_model), d_model),
                "wv": normal((d_model, d_model), d_model),
                "wo": normal((d_model, d_model), d_model),
                "norm_2": jnp.ones((d_model,), dtype),
                "router": normal((d_model, experts), d_model),
                "w_in": normal((experts, d_model, d_ff), d_model),
                "w_out": normal((experts, d_ff, d_model), d_ff),
            }

        return {
            "embed": normal((vocab, d_model), 1.0),
            "pos_embed": normal((seq, d_model), 1.0),
            "blocks": [block() for _ in range(layers)],
            "norm_f": jnp.ones((d_model,), dtype),
            "unembed": normal((d_model, vocab), d_model),
        }

    tx = optax.adam(learning_rate)
    params = jax.eval_shape(init, jax.random.key(0))
    opt_state = jax.eval_shape(tx.init, params)

    def loss_fn(params, inputs, targets):
        h = params["embed"][inputs] + params["pos_embed"]
        aux_loss = 0.0
        for p in params["blocks"]:
            h, block_aux = _block(h, p, heads, capacity)
            aux_loss = aux_loss + block_aux
        logits = _rms_norm(h, params["norm_f"]) @ params["unembed"]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
        return loss + aux_weight * aux_loss

    def train_step(params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return loss, params, opt_state

    inputs = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    targets = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return train_step, (params, opt_state, inputs, targets)
