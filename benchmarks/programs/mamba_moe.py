"""A Mamba + mixture-of-experts language model (MoE-Mamba) in plain JAX: one Adam training step.

Every block is a Mamba (S6) mixer followed by a top-k mixture-of-experts feed-forward layer,
each pre-RMSNorm and residual, the way MoE-Mamba (Pioro et al., 2024) and Jamba interleave them;
the selective scan is a ``jax.lax.scan`` over the sequence, as in the minimal Mamba ports users
write, and the experts are einsums over stacked weights:

    step(params, opt_state, tokens, targets) -> (loss, new_params, new_opt_state)

Forward pass (``B`` batch, ``S`` sequence, ``D`` model width, ``Di = 2 D`` the mixer's inner
width, ``N`` state size, ``R = ceil(D / 16)`` the step's rank, ``W`` the convolution width,
``E`` experts, ``k`` experts per token, ``F`` expert hidden width, ``C`` expert capacity,
``V`` vocabulary, ``L`` blocks):

* ``h = embed[tokens]`` (a ``gather``);
* ``L`` blocks, ``h += mamba(rms_norm(h))``, ``h += moe(rms_norm(h))``:

  - Mamba: ``x, z = split(x @ in_proj, 2)`` (``in_proj [D, 2 Di]``); a causal depthwise
    convolution of width ``W`` over the sequence (``lax.conv_general_dilated`` with
    ``feature_group_count = Di``, left padding ``W - 1``), SiLU; ``delta, Bm, Cm = split(x @
    x_proj, [R, R + N])``, ``delta = softplus(delta @ dt_proj + dt_bias)`` (``[B, S, Di]``);
    ``A = -exp(A_log)`` (``[Di, N]``), ``dA = exp(delta[..., None] * A)`` and ``dBx = delta *
    x * Bm`` (``[B, S, Di, N]``); the scan over ``S`` (the sequence moved to the front)
    ``state = dA_t * state + dBx_t``, ``y_t = einsum('bdn,bn->bd', state, Cm_t)``; ``y = (y + x
    * D_skip) * silu(z)``, then ``@ out_proj [Di, D]``;
  - mixture of experts, each sequence one group of ``S`` tokens: router logits ``einsum('gsd,de
    ->gse', x, router)``, ``jax.lax.top_k(logits, k)``, gates a ``softmax`` over the chosen
    logits; each choice's slot in its expert's buffer from a ``cumsum`` over the group's
    choices in (choice, token) order, kept below ``C = ceil(capacity_factor * k * S / E)``;
    ``combine [G, S, E, C]`` the sum over choices of gate x one-hot expert x one-hot slot,
    ``dispatch = combine > 0``; ``expert_in = einsum('gsec,gsd->egcd')``,
    ``silu(einsum('egcd,edf->egcf', ., w_in))``, ``einsum('egcf,efd->egcd', ., w_out)``,
    ``y = einsum('gsec,egcd->gsd', combine, .)``; a load-balancing loss (Switch's);

* final RMSNorm, an untied ``unembed [D, V]``;
* loss: ``optax.softmax_cross_entropy_with_integer_labels`` averaged over ``B * S``, plus
  ``aux_weight`` times the load-balancing losses.

Update: ``jax.value_and_grad``, then ``optax.adam``.

Parameters (``params``, a dict): ``embed [V, D]``, ``norm_f [D]``, ``unembed [D, V]`` and
``blocks``, a list of ``L`` dicts (names like ``params['blocks'][0]['in_proj']``): ``norm_1
[D]``, ``in_proj [D, 2 Di]``, ``conv_w [W, 1, Di]``, ``conv_b [Di]``, ``x_proj [Di, R + 2N]``,
``dt_proj [R, Di]``, ``dt_bias [Di]``, ``A_log [Di, N]``, ``D_skip [Di]``, ``out_proj [Di,
D]``, ``norm_2 [D]``, ``router [D, E]``, ``w_in [E, D, F]``, ``w_out [E, F, D]``.

Default sizes are small, so that ``toast analyze`` takes seconds: ``L=2, B=8, S=32, D=64
(Di=128), N=8, W=4, E=4, k=2, F=128, V=256``, capacity factor 1.25 (``C=20``). A 12-block
MoE-Mamba of GPT-2-small width is

    mamba_moe(layers=12, d_model=768, state=16, experts=8, d_ff=3072, seq=1024, batch=16,
              vocab=50304)

Only shapes are built (``jax.eval_shape``); the op count depends only on ``layers``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

__all__ = ["mamba_moe"]

RMS_EPS = 1e-6


def _rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * scale


def _selective_scan(dA, dBx, c):
    """``y [B, S, Di]`` of ``state_t = dA_t * state_{t-1} + dBx_t``, ``y_t = state_t . c_t``
    for ``dA, dBx [B, S, Di, N]``, ``c [B, S, N]``, the state starting at zero."""

    def step(state, inputs):
        dA_t, dBx_t, c_t = inputs
        state = dA_t * state + dBx_t
        return state, jnp.einsum("bdn,bn->bd", state, c_t)

    batch, _, inner, size = dA.shape
    time_major = (jnp.moveaxis(dA, 1, 0), jnp.moveaxis(dBx, 1, 0), jnp.moveaxis(c, 1, 0))
    _, ys = jax.lax.scan(step, jnp.zeros((batch, inner, size), dA.dtype), time_major)
    return jnp.moveaxis(ys, 0, 1)


def _mamba(x, p):
    inner = p["out_proj"].shape[0]
    rank = p["dt_proj"].shape[0]
    size = p["A_log"].shape[1]
    width = p["conv_w"].shape[0]
    x, z = jnp.split(x @ p["in_proj"], 2, axis=-1)
    x = jax.lax.conv_general_dilated(x, p["conv_w"], window_strides=(1,), padding=[(width - 1, 0)],
                                     dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=inner)
    x = jax.nn.silu(x + p["conv_b"])
    delta, b, c = jnp.split(x @ p["x_proj"], [rank, rank + size], axis=-1)
    delta = jax.nn.softplus(delta @ p["dt_proj"] + p["dt_bias"])
    a = -jnp.exp(p["A_log"])
    dA = jnp.exp(delta[..., None] * a)
    dBx = (delta * x)[..., None] * b[:, :, None, :]
    y = _selective_scan(dA, dBx, c) + x * p["D_skip"]
    return (y * jax.nn.silu(z)) @ p["out_proj"]


def _top_k_moe(x, p, *, top: int, capacity: int):
    """Top-``top`` mixture of experts over groups ``x [G, S, D]``; returns ``(y, aux_loss)``."""
    groups, seq, _ = x.shape
    experts = p["router"].shape[1]
    logits = jnp.einsum("gsd,de->gse", x, p["router"])
    probs = jax.nn.softmax(logits, axis=-1)
    top_logits, top_experts = jax.lax.top_k(logits, top)                    # [G, S, k]
    gates = jax.nn.softmax(top_logits, axis=-1)
    masks = jax.nn.one_hot(top_experts, experts, dtype=x.dtype)             # [G, S, k, E]
    # Slots in (choice, token) order: every first choice of the group before any second choice.
    ordered = jnp.swapaxes(masks, 1, 2).reshape(groups, top * seq, experts)
    slots = (jnp.cumsum(ordered, axis=1) - 1.0).reshape(groups, top, seq, experts)
    slots = jnp.swapaxes(slots, 1, 2)                                       # [G, S, k, E]
    kept = masks * (slots < capacity)
    slot = jnp.sum(slots * kept, axis=-1).astype(jnp.int32)                 # [G, S, k]
    combine = jnp.einsum("gsk,gske,gskc->gsec", gates, kept, jax.nn.one_hot(slot, capacity, dtype=x.dtype))
    dispatch = (combine > 0).astype(x.dtype)
    expert_in = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    hidden = jax.nn.silu(jnp.einsum("egcd,edf->egcf", expert_in, p["w_in"]))
    expert_out = jnp.einsum("egcf,efd->egcd", hidden, p["w_out"])
    y = jnp.einsum("gsec,egcd->gsd", combine, expert_out)
    fraction = jnp.mean(masks[:, :, 0, :], axis=1)
    aux_loss = jnp.mean(fraction * jnp.mean(probs, axis=1)) * experts * experts
    return y, aux_loss


def mamba_moe(*, layers: int = 2, batch: int = 8, seq: int = 32, d_model: int = 64, state: int = 8,
              conv_width: int = 4, experts: int = 4, top: int = 2, d_ff: int = 128, vocab: int = 256,
              capacity_factor: float = 1.25, aux_weight: float = 0.01, learning_rate: float = 3e-4,
              dtype=jnp.float32):
    """Returns ``(fn, (params, opt_state, tokens, targets))`` for one MoE-Mamba Adam step.

    Args:
        layers: ``L``, blocks (each a Mamba mixer and a mixture of experts).
        batch: ``B``, sequences per step (each one routing group).
        seq: ``S``, tokens per sequence (the scan's length).
        d_model: ``D``, the residual width (the mixer's inner width is ``2 D``).
        state: ``N``, the selective scan's state size per channel.
        conv_width: ``W``, the causal convolution's width.
        experts: ``E``, experts per layer (at least ``top``).
        top: ``k``, experts per token.
        d_ff: ``F``, each expert's hidden width.
        vocab: ``V``, vocabulary size.
        capacity_factor: expert buffer size over the even share of the ``k S`` choices of a
            group: ``C = ceil(capacity_factor * k * S / E)``.
        aux_weight: weight of the load-balancing loss.
        learning_rate: Adam step size, a constant of the program.
        dtype: element type of the parameters.

    ``fn`` takes ``tokens, targets: int32[B, S]``, ``params`` (the module docstring) and optax's
    Adam state, and returns ``(loss: dtype[], new_params, new_opt_state)``.
    """
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    if not 1 <= top <= experts:
        raise ValueError(f"top={top} must be between 1 and experts={experts}")
    inner = 2 * d_model
    rank = math.ceil(d_model / 16)
    capacity = math.ceil(capacity_factor * top * seq / experts)

    def init(key):
        keys = iter(jax.random.split(key, 3 + 8 * layers))

        def normal(shape, fan_in):
            return jax.random.normal(next(keys), shape, dtype) / math.sqrt(fan_in)

        def block():
            return {
                "norm_1": jnp.ones((d_model,), dtype),
                "in_proj": normal((d_model, 2 * inner), d_model),
                "conv_w": normal((conv_width, 1, inner), conv_width),
                "conv_b": jnp.zeros((inner,), dtype),
                "x_proj": normal((inner, rank + 2 * state), inner),
                "dt_proj": normal((rank, inner), rank),
                "dt_bias": jnp.full((inner,), math.log(math.expm1(0.01)), dtype),
                "A_log": jnp.log(jnp.broadcast_to(jnp.arange(1, state + 1, dtype=dtype), (inner, state))),
                "D_skip": jnp.ones((inner,), dtype),
                "out_proj": normal((inner, d_model), inner),
                "norm_2": jnp.ones((d_model,), dtype),
                "router": normal((d_model, experts), d_model),
                "w_in": normal((experts, d_model, d_ff), d_model),
                "w_out": normal((experts, d_ff, d_model), d_ff),
            }

        return {
            "embed": normal((vocab, d_model), 1.0),
            "blocks": [block() for _ in range(layers)],
            "norm_f": jnp.ones((d_model,), dtype),
            "unembed": normal((d_model, vocab), d_model),
        }

    tx = optax.adam(learning_rate)
    params = jax.eval_shape(init, jax.random.key(0))
    opt_state = jax.eval_shape(tx.init, params)

    def loss_fn(params, tokens, targets):
        h = params["embed"][tokens]
        aux_loss = 0.0
        for p in params["blocks"]:
            h = h + _mamba(_rms_norm(h, p["norm_1"]), p)
            y, block_aux = _top_k_moe(_rms_norm(h, p["norm_2"]), p, top=top, capacity=capacity)
            h = h + y
            aux_loss = aux_loss + block_aux
        logits = _rms_norm(h, params["norm_f"]) @ params["unembed"]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
        return loss + aux_weight * aux_loss

    def train_step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return loss, params, opt_state

    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    targets = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return train_step, (params, opt_state, tokens, targets)
