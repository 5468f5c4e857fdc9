"""A diffusion U-Net (DDPM-style): one full Adam training step.

The TOAST paper's U-Net (section 5.1): residual down-sampling blocks, a multi-head attention
layer in the middle, residual up-sampling blocks with skip connections from the down path.

    step(params, opt_state, noisy_images, timesteps, noise)
        -> (loss, new_params, new_opt_state)

Inputs (``B`` batch, ``S`` image side, ``C`` image channels): ``noisy_images: [B, S, S, C]``
(NHWC), diffusion ``timesteps: int32[B]`` and the ``noise: [B, S, S, C]`` the model must
predict.  Convolutions are ``jax.lax.conv_general_dilated`` with NHWC images and HWIO
kernels (``stablehlo.convolution``).  Widths: ``base`` channels times ``multipliers[l]`` at
level ``l``; ``T = 4 * base`` for the time embedding.

* time embedding: sinusoidal features of ``timesteps`` (``[B, base]``: ``sin`` and ``cos``
  of ``t * 10000^(-i/(base/2))``), then ``dense -> SiLU -> dense`` (``[B, T]``);
* ``conv_in``: 3x3, ``C -> base``;
* down path, per level: ``blocks_per_level`` residual blocks to ``base * multipliers[l]``
  channels, then (but at the last level) a 3x3 stride-2 convolution halving the image side;
  every block's and down-sampler's output is kept as a skip;
* middle: a residual block, self-attention with ``heads`` heads over the ``H*W`` positions
  (pre-GroupNorm; ``q, k, v = x @ w + b`` with ``w: [ch, heads, ch/heads]``, softmax of
  ``q.k / sqrt(ch/heads)``, output projection ``wo: [heads, ch/heads, ch]``; residual), a
  residual block;
* up path, levels in reverse: ``blocks_per_level + 1`` residual blocks, each on
  ``concat([h, skip])`` (channels, the skips popped last-in first-out), then (but at level 0)
  nearest-neighbour 2x up-sampling (``broadcast_in_dim`` and ``reshape``) and a 3x3 conv;
* out: GroupNorm, SiLU, 3x3 conv ``base -> C``; loss: mean squared error against ``noise``.

A residual block ``in -> out``: ``h = conv1(silu(norm1(x)))``, ``h += dense(silu(temb))``
(broadcast over positions), ``h = conv2(silu(norm2(h)))``, ``return skip(x) + h`` where
``skip`` is a 1x1 projection (a ``dot_general`` over channels) when ``in != out``.  Norms are
GroupNorm with ``gcd(32, ch)`` groups (a ``reshape`` splitting channels into groups).

Backward: ``jax.value_and_grad`` (convolution gradients are convolutions).  Update: Adam in
plain ``jnp`` (``toast.examples.adam.adam_update``), ``opt_state = {count: int32[], mu, nu}``.

Parameters (``params``, a dict; names like ``params['down'][4]['conv1_kernel']``):
``time_mlp: {w1, b1, w2, b2}``, ``conv_in``, ``conv_out``: ``{kernel, bias}``,
``norm_out: {scale, bias}``, ``down``: list of residual blocks (``norm1_scale, norm1_bias,
conv1_kernel, conv1_bias, temb_w, temb_b, norm2_scale, norm2_bias, conv2_kernel, conv2_bias``
and, when channels change, ``skip_w, skip_b``), ``downsample``: list of ``{kernel, bias}``,
``mid_blocks``: two residual blocks, ``attention: {norm_scale, norm_bias, wq, bq, wk, bk, wv,
bv, wo, bo}``, ``up``: list of residual blocks, ``upsample``: list of ``{kernel, bias}``.

Sizes: ``unet()`` is near the paper's (which gives 3.6B parameters, 9 residual down-sampling
blocks, 12 up-sampling blocks and a 32-head attention layer): 3 levels of 3 blocks
(``multipliers=(1, 2, 4)``, ``base=896``: 896, 1792 and 3584 channels) give 9 down and 12 up
blocks, 32 heads of 112 over 3584 channels at 16x16 positions; ``B=8``, 64x64 images with 4
channels (a latent-diffusion shape).  It has 3,655,757,956 parameters (2.0B in the up path,
0.9B in the down path, 0.5B in the two middle blocks, 51M in the attention), and the Adam
moments twice that again.  ``unet_small()`` is
tiny, for tests.  Only shapes are built (``jax.ShapeDtypeStruct``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from toast.examples.adam import adam_state, adam_update

__all__ = ["unet_train_step", "unet", "unet_small"]

_DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")


def _groups(channels: int) -> int:
    return math.gcd(32, channels)


def _group_norm(x, scale, bias, eps: float = 1e-5):
    batch, height, width, channels = x.shape
    groups = _groups(channels)
    g = x.reshape(batch, height, width, groups, channels // groups)
    mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
    centered = g - mean
    var = jnp.mean(centered * centered, axis=(1, 2, 4), keepdims=True)
    g = centered * lax.rsqrt(var + eps)
    return g.reshape(x.shape) * scale + bias


def _conv(x, kernel, bias, stride: int = 1):
    y = lax.conv_general_dilated(x, kernel, window_strides=(stride, stride), padding=((1, 1), (1, 1)),
                                 dimension_numbers=_DIMENSION_NUMBERS)
    return y + bias


def _res_block(p: dict[str, Any], x, temb):
    h = _conv(jax.nn.silu(_group_norm(x, p["norm1_scale"], p["norm1_bias"])), p["conv1_kernel"], p["conv1_bias"])
    h = h + (jax.nn.silu(temb) @ p["temb_w"] + p["temb_b"])[:, None, None, :]
    h = _conv(jax.nn.silu(_group_norm(h, p["norm2_scale"], p["norm2_bias"])), p["conv2_kernel"], p["conv2_bias"])
    if "skip_w" in p:
        x = x @ p["skip_w"] + p["skip_b"]
    return x + h


def _attention(p: dict[str, Any], x):
    batch, height, width, channels = x.shape
    heads, head_dim = p["wq"].shape[1:]
    h = _group_norm(x, p["norm_scale"], p["norm_bias"]).reshape(batch, height * width, channels)
    q = jnp.einsum("bsc,chd->bshd", h, p["wq"]) + p["bq"]
    k = jnp.einsum("bsc,chd->bshd", h, p["wk"]) + p["bk"]
    v = jnp.einsum("bsc,chd->bshd", h, p["wv"]) + p["bv"]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    out = jnp.einsum("bshd,hdc->bsc", out, p["wo"]) + p["bo"]
    return x + out.reshape(x.shape)


def _upsample(x):
    """Nearest-neighbour 2x: ``[B, H, W, C] -> [B, 2H, 2W, C]`` by broadcast and reshape."""
    batch, height, width, channels = x.shape
    x = jnp.broadcast_to(x[:, :, None, :, None, :], (batch, height, 2, width, 2, channels))
    return x.reshape(batch, 2 * height, 2 * width, channels)


def _timestep_features(timesteps, dim: int, dtype):
    half = dim // 2
    freqs = np.exp(-math.log(10000.0) * np.arange(half) / half).astype(np.float32)
    angles = timesteps.astype(jnp.float32)[:, None] * freqs[None, :]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1).astype(dtype)


def unet_train_step(*, batch: int = 8, image: int = 64, channels: int = 4, base: int = 896,
                    multipliers: Sequence[int] = (1, 2, 4), blocks_per_level: int = 3, heads: int = 32,
                    dtype=jnp.float32, learning_rate: float = 1e-4):
    """Returns ``(fn, (params, opt_state, noisy_images, timesteps, noise))`` for one U-Net step.

    Long on purpose: the model is written in one place as a diffusion codebase writes it (the level and
    block loops build the network the shapes below describe).

    Args:
        batch: ``B``, images per step.
        image: ``S``, the side of the square images; divisible by ``2 ** (len(multipliers) - 1)``.
        channels: ``C``, image channels.
        base: channels at level 0 (even: the sinusoidal embedding has ``base`` features).
        multipliers: channel multiplier per level; the image side halves between levels.
        blocks_per_level: residual blocks per level on the way down (one more on the way up).
        heads: attention heads in the middle; must divide the deepest level's channels.
        dtype: element type of images, parameters and Adam moments.
        learning_rate: Adam step size, a constant of the program.

    ``fn`` returns ``(loss: dtype[], new_params, new_opt_state)``, shaped like its inputs.
    """
    levels = len(multipliers)
    if levels < 1 or blocks_per_level < 1:
        raise ValueError("a U-Net needs at least one level and one block per level")
    if image % 2 ** (levels - 1):
        raise ValueError(f"image={image} is not divisible by 2**{levels - 1} (the down-sampling)")
    if base % 2:
        raise ValueError(f"base={base} must be even (sinusoidal time features)")
    widths = [base * m for m in multipliers]
    if widths[-1] % heads:
        raise ValueError(f"heads={heads} does not divide the middle's {widths[-1]} channels")
    temb_dim = 4 * base

    def loss_fn(params, noisy_images, timesteps, noise):
        temb = _timestep_features(timesteps, base, noisy_images.dtype)
        temb = jax.nn.silu(temb @ params["time_mlp"]["w1"] + params["time_mlp"]["b1"])
        temb = temb @ params["time_mlp"]["w2"] + params["time_mlp"]["b2"]
        h = _conv(noisy_images, params["conv_in"]["kernel"], params["conv_in"]["bias"])
        skips = [h]
        down = iter(params["down"])
        for level in range(levels):
            for _ in range(blocks_per_level):
                h = _res_block(next(down), h, temb)
                skips.append(h)
            if level < levels - 1:
                p = params["downsample"][level]
                h = _conv(h, p["kernel"], p["bias"], stride=2)
                skips.append(h)
        h = _res_block(params["mid_blocks"][0], h, temb)
        h = _attention(params["attention"], h)
        h = _res_block(params["mid_blocks"][1], h, temb)
        up = iter(params["up"])
        for level in reversed(range(levels)):
            for _ in range(blocks_per_level + 1):
                h = _res_block(next(up), jnp.concatenate([h, skips.pop()], axis=-1), temb)
            if level > 0:
                p = params["upsample"][levels - 1 - level]
                h = _conv(_upsample(h), p["kernel"], p["bias"])
        h = jax.nn.silu(_group_norm(h, params["norm_out"]["scale"], params["norm_out"]["bias"]))
        diff = _conv(h, params["conv_out"]["kernel"], params["conv_out"]["bias"]) - noise
        return jnp.mean(diff * diff)

    def train_step(params, opt_state, noisy_images, timesteps, noise):
        loss, grads = jax.value_and_grad(loss_fn)(params, noisy_images, timesteps, noise)
        new_params, new_opt_state = adam_update(params, grads, opt_state, learning_rate)
        return loss, new_params, new_opt_state

    def spec(*shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    def conv(c_in, c_out):
        return {"kernel": spec(3, 3, c_in, c_out), "bias": spec(c_out)}

    def res_block(c_in, c_out):
        p = {"norm1_scale": spec(c_in), "norm1_bias": spec(c_in),
             "conv1_kernel": spec(3, 3, c_in, c_out), "conv1_bias": spec(c_out),
             "temb_w": spec(temb_dim, c_out), "temb_b": spec(c_out),
             "norm2_scale": spec(c_out), "norm2_bias": spec(c_out),
             "conv2_kernel": spec(3, 3, c_out, c_out), "conv2_bias": spec(c_out)}
        if c_in != c_out:
            p["skip_w"] = spec(c_in, c_out)
            p["skip_b"] = spec(c_out)
        return p

    down, downsample, skip_widths = [], [], [base]
    width = base
    for level, level_width in enumerate(widths):
        for _ in range(blocks_per_level):
            down.append(res_block(width, level_width))
            width = level_width
            skip_widths.append(width)
        if level < levels - 1:
            downsample.append(conv(width, width))
            skip_widths.append(width)
    mid = widths[-1]
    head_dim = mid // heads
    attention = {"norm_scale": spec(mid), "norm_bias": spec(mid),
                 "wq": spec(mid, heads, head_dim), "bq": spec(heads, head_dim),
                 "wk": spec(mid, heads, head_dim), "bk": spec(heads, head_dim),
                 "wv": spec(mid, heads, head_dim), "bv": spec(heads, head_dim),
                 "wo": spec(heads, head_dim, mid), "bo": spec(mid)}
    up, upsample = [], []
    for level in reversed(range(levels)):
        for _ in range(blocks_per_level + 1):
            up.append(res_block(width + skip_widths.pop(), widths[level]))
            width = widths[level]
        if level > 0:
            upsample.append(conv(width, width))
    params = {
        "time_mlp": {"w1": spec(base, temb_dim), "b1": spec(temb_dim),
                     "w2": spec(temb_dim, temb_dim), "b2": spec(temb_dim)},
        "conv_in": conv(channels, base),
        "down": down,
        "downsample": downsample,
        "mid_blocks": [res_block(mid, mid), res_block(mid, mid)],
        "attention": attention,
        "up": up,
        "upsample": upsample,
        "norm_out": {"scale": spec(base), "bias": spec(base)},
        "conv_out": conv(base, channels),
    }
    args = (
        params,
        adam_state(params),
        spec(batch, image, image, channels),             # noisy_images
        jax.ShapeDtypeStruct((batch,), jnp.int32),       # timesteps
        spec(batch, image, image, channels),             # noise
    )
    return train_step, args


def unet(**overrides: Any):
    """Near the paper's U-Net: B=8, 64x64x4 images, base 896, multipliers (1, 2, 4), 3 blocks
    per level (9 down, 12 up), 32 heads in the middle."""
    settings: dict[str, Any] = dict(batch=8, image=64, channels=4, base=896, multipliers=(1, 2, 4),
                                    blocks_per_level=3, heads=32)
    return unet_train_step(**{**settings, **overrides})


def unet_small(**overrides: Any):
    """A tiny U-Net step for tests: B=2, 8x8x3 images, base 8, multipliers (1, 2), 1 block per
    level (2 down, 4 up), 4 heads over 16 channels; 41,899 parameters."""
    settings: dict[str, Any] = dict(batch=2, image=8, channels=3, base=8, multipliers=(1, 2),
                                    blocks_per_level=1, heads=4)
    return unet_train_step(**{**settings, **overrides})
