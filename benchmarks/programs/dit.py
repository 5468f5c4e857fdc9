"""A class-conditional diffusion transformer (DiT) written with Flax NNX: one Adam training step.

The model is DiT (Peebles and Xie, 2023) as Flax NNX users write it: ``nnx.Module`` classes
built from ``nnx.Linear``, ``nnx.Embed`` and ``nnx.LayerNorm``, the blocks in an ``nnx.List``,
the step on plain pytrees (``graphdef, params = nnx.split(model)`` outside,
``nnx.merge(graphdef, params)`` inside). The step is the usual epsilon-prediction objective:

    step(params, opt_state, latents, noise, timesteps, labels) -> (loss, new_params, new_opt_state)

Forward pass (``B`` batch, ``I`` latent height and width, ``C`` latent channels, ``P`` patch
size, ``N = (I / P)^2`` tokens, ``D`` model width, ``H`` heads, ``Dh = D / H``, ``F = 4 D``
MLP width, ``K`` classes, ``L`` blocks, ``T`` diffusion steps):

* noising: ``alpha_bar = cos^2((t / T + s) / (1 + s) * pi / 2)`` (the cosine schedule, from
  the integer ``timesteps``), ``x_t = sqrt(alpha_bar) latents + sqrt(1 - alpha_bar) noise``;
* patchify: ``x_t [B, I, I, C]`` reshaped to ``[B, I/P, P, I/P, P, C]``, transposed to
  ``[B, I/P, I/P, P, P, C]`` and reshaped to ``[B, N, P*P*C]``, embedded by
  ``x_embed`` (``nnx.Linear(P*P*C, D)``) plus a fixed 2-D sine-cosine position table ``[N, D]``
  (a constant of the program);
* conditioning: ``c = t_embed(t) + y_embed(labels)``: the timestep's sinusoidal frequencies
  (256 of them) through ``nnx.Linear(256, D)``, SiLU, ``nnx.Linear(D, D)``; the label an
  ``nnx.Embed(K + 1, D)`` row (the last is the null class of classifier-free guidance);
* ``L`` DiT blocks with adaLN-Zero: ``shift_1, scale_1, gate_1, shift_2, scale_2, gate_2 =
  split(ada(silu(c)), 6)`` (``nnx.Linear(D, 6 D)``); ``h += gate_1 * attn(modulate(ln_1(h),
  shift_1, scale_1))`` and ``h += gate_2 * mlp(modulate(ln_2(h), shift_2, scale_2))`` with
  ``modulate(x, shift, scale) = x * (1 + scale) + shift`` and LayerNorms without affine
  parameters; the attention is bidirectional (``q, k, v, out`` ``nnx.Linear(D, D)``, heads by
  a reshape), the MLP ``fc_2(gelu_tanh(fc_1(x)))``;
* final layer: adaLN (``nnx.Linear(D, 2 D)``: shift and scale), LayerNorm, ``nnx.Linear(D,
  P*P*C)``, unpatchified back to ``[B, I, I, C]``;
* loss: ``mean((prediction - noise)^2)``.

Update: ``jax.value_and_grad``, then ``optax.adam`` (``tx.update``, ``optax.apply_updates``).

Argument names follow the ``nnx.State`` paths, e.g.
``params['blocks'][0]['attn']['query']['kernel'].value`` (``[D, D]``),
``params['blocks'][0]['mlp']['fc_1']['kernel'].value`` (``[D, F]``), ``latents``, ``noise``
(``float32[B, I, I, C]``), ``timesteps``, ``labels`` (``int32[B]``).

Default sizes are small, so that ``toast analyze`` takes seconds: ``L=2, B=8, I=16, C=4,
P=2 (N=64), D=64, H=4, K=10``. A DiT-B/2 on 256-pixel images' 32 x 32 x 4 latents is

    dit(layers=12, d_model=768, heads=12, image=32, channels=4, patch=2, classes=1000, batch=64)

Only shapes are built (``nnx.eval_shape``, ``jax.eval_shape``); the op count depends only on
``layers``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

__all__ = ["dit"]

FREQUENCIES = 256  # the timestep embedding's sinusoid count (DiT's frequency_embedding_size)
COSINE_OFFSET = 0.008  # the cosine schedule's s (Nichol and Dhariwal)


def _modulate(x, shift, scale):
    return x * (1 + scale[:, None, :]) + shift[:, None, :]


def _timestep_frequencies(t, max_period: float = 10_000.0):
    """``[B, 256]``: ``cos`` and ``sin`` of ``t`` times 128 geometric frequencies (DiT's)."""
    half = FREQUENCIES // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = t.astype(jnp.float32)[:, None] * freqs[None, :]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


def _position_table(grid: int, d_model: int) -> np.ndarray:
    """``[grid * grid, D]``: the fixed 2-D sine-cosine position embedding (MAE's, DiT's)."""
    quarter = d_model // 4
    omega = 1.0 / 10_000 ** (np.arange(quarter, dtype=np.float64) / quarter)
    rows, cols = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")

    def embed(positions):
        angles = positions.reshape(-1)[:, None] * omega[None, :]
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    return np.concatenate([embed(rows), embed(cols)], axis=1).astype(np.float32)


class Attention(nnx.Module):
    """Bidirectional multi-head self-attention with ``D -> D`` projections."""

    def __init__(self, d_model: int, heads: int, *, dtype, rngs: nnx.Rngs):
        self.heads = heads
        self.query = nnx.Linear(d_model, d_model, param_dtype=dtype, rngs=rngs)
        self.key = nnx.Linear(d_model, d_model, param_dtype=dtype, rngs=rngs)
        self.value = nnx.Linear(d_model, d_model, param_dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        batch, tokens, d_model = x.shape
        head_dim = d_model // self.heads
        q = self.query(x).reshape(batch, tokens, self.heads, head_dim)
        k = self.key(x).reshape(batch, tokens, self.heads, head_dim)
        v = self.value(x).reshape(batch, tokens, self.heads, head_dim)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        weights = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, tokens, d_model)
        return self.out(out)


class MLP(nnx.Module):
    def __init__(self, d_model: int, d_ff: int, *, dtype, rngs: nnx.Rngs):
        self.fc_1 = nnx.Linear(d_model, d_ff, param_dtype=dtype, rngs=rngs)
        self.fc_2 = nnx.Linear(d_ff, d_model, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.fc_2(jax.nn.gelu(self.fc_1(x), approximate=True))


class DiTBlock(nnx.Module):
    """A DiT block with adaLN-Zero conditioning."""

    def __init__(self, d_model: int, heads: int, d_ff: int, *, dtype, rngs: nnx.Rngs):
        self.ln_1 = nnx.LayerNorm(d_model, use_bias=False, use_scale=False, epsilon=1e-6, rngs=rngs)
        self.attn = Attention(d_model, heads, dtype=dtype, rngs=rngs)
        self.ln_2 = nnx.LayerNorm(d_model, use_bias=False, use_scale=False, epsilon=1e-6, rngs=rngs)
        self.mlp = MLP(d_model, d_ff, dtype=dtype, rngs=rngs)
        self.ada = nnx.Linear(d_model, 6 * d_model, param_dtype=dtype, rngs=rngs)

    def __call__(self, h, c):
        shift_1, scale_1, gate_1, shift_2, scale_2, gate_2 = jnp.split(self.ada(jax.nn.silu(c)), 6, axis=-1)
        h = h + gate_1[:, None, :] * self.attn(_modulate(self.ln_1(h), shift_1, scale_1))
        return h + gate_2[:, None, :] * self.mlp(_modulate(self.ln_2(h), shift_2, scale_2))


class FinalLayer(nnx.Module):
    def __init__(self, d_model: int, patch_dim: int, *, dtype, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(d_model, use_bias=False, use_scale=False, epsilon=1e-6, rngs=rngs)
        self.ada = nnx.Linear(d_model, 2 * d_model, param_dtype=dtype, rngs=rngs)
        self.linear = nnx.Linear(d_model, patch_dim, param_dtype=dtype, rngs=rngs)

    def __call__(self, h, c):
        shift, scale = jnp.split(self.ada(jax.nn.silu(c)), 2, axis=-1)
        return self.linear(_modulate(self.norm(h), shift, scale))


class DiT(nnx.Module):
    def __init__(self, *, image: int, channels: int, patch: int, d_model: int, heads: int, d_ff: int,
                 layers: int, classes: int, dtype, rngs: nnx.Rngs):
        self.image, self.channels, self.patch, self.d_model = image, channels, patch, d_model
        patch_dim = patch * patch * channels
        self.x_embed = nnx.Linear(patch_dim, d_model, param_dtype=dtype, rngs=rngs)
        self.t_fc_1 = nnx.Linear(FREQUENCIES, d_model, param_dtype=dtype, rngs=rngs)
        self.t_fc_2 = nnx.Linear(d_model, d_model, param_dtype=dtype, rngs=rngs)
        self.y_embed = nnx.Embed(classes + 1, d_model, param_dtype=dtype, rngs=rngs)
        self.blocks = nnx.List([DiTBlock(d_model, heads, d_ff, dtype=dtype, rngs=rngs) for _ in range(layers)])
        self.final = FinalLayer(d_model, patch_dim, dtype=dtype, rngs=rngs)

    def patchify(self, x):
        batch, grid, p, c = x.shape[0], self.image // self.patch, self.patch, self.channels
        x = x.reshape(batch, grid, p, grid, p, c).transpose(0, 1, 3, 2, 4, 5)
        return x.reshape(batch, grid * grid, p * p * c)

    def unpatchify(self, x):
        batch, grid, p, c = x.shape[0], self.image // self.patch, self.patch, self.channels
        x = x.reshape(batch, grid, grid, p, p, c).transpose(0, 1, 3, 2, 4, 5)
        return x.reshape(batch, grid * p, grid * p, c)

    def __call__(self, x, t, y):
        grid = self.image // self.patch
        h = self.x_embed(self.patchify(x)) + _position_table(grid, self.d_model)
        c = self.t_fc_2(jax.nn.silu(self.t_fc_1(_timestep_frequencies(t)))) + self.y_embed(y)
        for block in self.blocks:
            h = block(h, c)
        return self.unpatchify(self.final(h, c))


def dit(*, layers: int = 2, batch: int = 8, image: int = 16, channels: int = 4, patch: int = 2,
        d_model: int = 64, heads: int = 4, classes: int = 10, diffusion_steps: int = 1000,
        learning_rate: float = 1e-4, dtype=jnp.float32):
    """Returns ``(fn, (params, opt_state, latents, noise, timesteps, labels))`` for one DiT Adam step.

    Args:
        layers: ``L``, DiT blocks.
        batch: ``B``, images per step.
        image: ``I``, the latents' height and width; divisible by ``patch``.
        channels: ``C``, latent channels.
        patch: ``P``, the patch size (``N = (I / P)^2`` tokens).
        d_model: ``D``, the width; divisible by ``heads`` and by 4 (the 2-D position table).
        heads: ``H``, attention heads.
        classes: ``K``, class labels (the embedding has ``K + 1`` rows).
        diffusion_steps: ``T``, the schedule's length (``timesteps`` lie in ``[0, T)``).
        learning_rate: Adam step size, a constant of the program.
        dtype: element type of the parameters.

    ``fn`` takes ``latents, noise: float32[B, I, I, C]``, ``timesteps, labels: int32[B]``, the
    ``nnx.State`` and optax's Adam state, and returns ``(loss: float32[], new_params,
    new_opt_state)``.
    """
    if d_model % heads or d_model % 4:
        raise ValueError(f"d_model={d_model} must be divisible by heads={heads} and by 4")
    if image % patch:
        raise ValueError(f"image={image} is not divisible by patch={patch}")
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")

    abstract = nnx.eval_shape(lambda: DiT(
        image=image, channels=channels, patch=patch, d_model=d_model, heads=heads, d_ff=4 * d_model,
        layers=layers, classes=classes, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract)
    tx = optax.adam(learning_rate)
    opt_state = jax.eval_shape(tx.init, params)

    def loss_fn(params, latents, noise, timesteps, labels):
        model = nnx.merge(graphdef, params)
        fraction = (timesteps.astype(jnp.float32) / diffusion_steps + COSINE_OFFSET) / (1 + COSINE_OFFSET)
        alpha_bar = jnp.cos(fraction * jnp.pi / 2) ** 2
        alpha_bar = alpha_bar[:, None, None, None]
        noisy = jnp.sqrt(alpha_bar) * latents + jnp.sqrt(1 - alpha_bar) * noise
        prediction = model(noisy, timesteps, labels)
        return jnp.mean((prediction - noise) ** 2)

    def train_step(params, opt_state, latents, noise, timesteps, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, latents, noise, timesteps, labels)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return loss, params, opt_state

    latents = jax.ShapeDtypeStruct((batch, image, image, channels), jnp.float32)
    noise = jax.ShapeDtypeStruct((batch, image, image, channels), jnp.float32)
    timesteps = jax.ShapeDtypeStruct((batch,), jnp.int32)
    labels = jax.ShapeDtypeStruct((batch,), jnp.int32)
    return train_step, (params, opt_state, latents, noise, timesteps, labels)
