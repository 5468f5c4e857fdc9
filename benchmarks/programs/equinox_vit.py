"""A Vision Transformer written with Equinox: one Adam training step on an image batch.

The model is written the way Equinox users write one (after Equinox's own ViT example):
``eqx.Module`` classes built from ``eqx.nn.Linear``, ``eqx.nn.LayerNorm`` and
``eqx.nn.MultiheadAttention``, each acting on one unbatched example, with ``jax.vmap`` over the
tokens inside the model and over the batch in the loss. The step takes plain pytrees:
``params, static = eqx.partition(model, eqx.is_array)`` outside, ``eqx.combine(params,
static)`` inside, the static part closed over.

    step(params, opt_state, images, labels) -> (loss, new_params, new_opt_state)

Forward pass of one image (``B`` batch, ``C`` channels, ``I`` image side, ``P`` patch side,
``N = (I / P)^2`` patches, ``D`` model width, ``H`` heads, ``Dh = D / H``, ``F`` MLP width,
``K`` classes, ``L`` layers):

* patch embedding: ``[C, I, I]`` reshaped and transposed to ``[N, C P P]`` (``c (h ph) (w pw)
  -> (h w) (c ph pw)``), a vmapped ``eqx.nn.Linear`` ``C P P -> D``, plus a learned position
  embedding ``pos_embed [N, D]``;
* ``L`` pre-LayerNorm blocks, ``x += attention(ln1(x))``, ``x += linear2(gelu(linear1(ln2(x))))``:
  ``eqx.nn.MultiheadAttention`` (no biases: ``query_proj``, ``key_proj``, ``value_proj`` ``D ->
  H Dh``, ``output_proj`` ``H Dh -> D``; its scores and softmax vmapped over the heads), the MLP
  ``D -> F -> D``; the LayerNorms and Linears vmapped over the ``N`` tokens;
* final LayerNorm, mean pooling over the patches (no class token, so that ``N`` stays
  divisible), a ``head`` ``eqx.nn.Linear`` ``D -> K``;
* loss: ``optax.softmax_cross_entropy_with_integer_labels`` averaged over the batch.

Update: ``eqx.filter_value_and_grad`` of the loss with respect to ``params``, then
``optax.adam`` (``tx.update`` and ``optax.apply_updates``).

Argument names (as ``toast analyze`` prints them) follow the module attributes, e.g.
``params.blocks[0].attention.query_proj.weight`` (``[H Dh, D]``: Equinox stores a Linear's
weight as ``[out, in]``), ``params.blocks[0].linear1.weight`` (``[F, D]``), ``params.pos_embed``
(``[N, D]``), ``opt_state[0].mu.head.weight``, ``images`` (``[B, C, I, I]``) and ``labels``
(``int32[B]``).

Default sizes are small, so that ``toast analyze`` takes seconds: ``B=8, C=3, I=32, P=8`` (16
patches), ``L=2, D=64, H=8, F=256, K=10``. The benchmark size is ViT-B/16 on ImageNet::

    equinox_vit(image=224, patch=16, layers=12, d_model=768, heads=12, classes=1000, batch=64)

Only shapes are built (``eqx.filter_eval_shape``, ``jax.eval_shape``): sizes cost nothing until
the program is compiled, and the op count depends only on ``layers``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

__all__ = ["equinox_vit"]


class PatchEmbedding(eqx.Module):
    """``[C, I, I]`` -> ``[N, D]``: non-overlapping ``P x P`` patches, flattened and projected."""

    linear: eqx.nn.Linear
    patch: int = eqx.field(static=True)

    def __init__(self, channels: int, d_model: int, patch: int, *, dtype, key):
        self.patch = patch
        self.linear = eqx.nn.Linear(channels * patch * patch, d_model, dtype=dtype, key=key)

    def __call__(self, x):
        channels, height, width = x.shape
        p = self.patch
        x = x.reshape(channels, height // p, p, width // p, p)
        x = x.transpose(1, 3, 0, 2, 4).reshape((height // p) * (width // p), channels * p * p)
        return jax.vmap(self.linear)(x)


class AttentionBlock(eqx.Module):
    """A pre-LayerNorm transformer block on one example's tokens ``[N, D]``."""

    ln1: eqx.nn.LayerNorm
    attention: eqx.nn.MultiheadAttention
    ln2: eqx.nn.LayerNorm
    linear1: eqx.nn.Linear
    linear2: eqx.nn.Linear

    def __init__(self, d_model: int, heads: int, d_ff: int, *, dtype, key):
        key1, key2, key3 = jax.random.split(key, 3)
        self.ln1 = eqx.nn.LayerNorm(d_model, dtype=dtype)
        self.attention = eqx.nn.MultiheadAttention(heads, d_model, dtype=dtype, key=key1)
        self.ln2 = eqx.nn.LayerNorm(d_model, dtype=dtype)
        self.linear1 = eqx.nn.Linear(d_model, d_ff, dtype=dtype, key=key2)
        self.linear2 = eqx.nn.Linear(d_ff, d_model, dtype=dtype, key=key3)

    def __call__(self, x):
        y = jax.vmap(self.ln1)(x)
        x = x + self.attention(y, y, y)
        y = jax.vmap(self.ln2)(x)
        y = jax.vmap(self.linear1)(y)
        y = jax.nn.gelu(y)
        y = jax.vmap(self.linear2)(y)
        return x + y


class VisionTransformer(eqx.Module):
    """Patch embedding, position embedding, ``L`` blocks, LayerNorm, mean pooling, a linear head."""

    patch_embedding: PatchEmbedding
    pos_embed: jax.Array
    blocks: list[AttentionBlock]
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, *, channels: int, image: int, patch: int, d_model: int, heads: int, d_ff: int,
                 layers: int, classes: int, dtype, key):
        keys = jax.random.split(key, layers + 3)
        patches = (image // patch) ** 2
        self.patch_embedding = PatchEmbedding(channels, d_model, patch, dtype=dtype, key=keys[0])
        self.pos_embed = 0.02 * jax.random.normal(keys[1], (patches, d_model), dtype=dtype)
        self.blocks = [AttentionBlock(d_model, heads, d_ff, dtype=dtype, key=k) for k in keys[3:]]
        self.norm = eqx.nn.LayerNorm(d_model, dtype=dtype)
        self.head = eqx.nn.Linear(d_model, classes, dtype=dtype, key=keys[2])

    def __call__(self, image):
        x = self.patch_embedding(image) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        x = jax.vmap(self.norm)(x)
        return self.head(jnp.mean(x, axis=0))


def equinox_vit(*, batch: int = 8, channels: int = 3, image: int = 32, patch: int = 8, layers: int = 2,
                d_model: int = 64, heads: int = 8, d_ff: int | None = None, classes: int = 10,
                learning_rate: float = 1e-3, dtype=jnp.float32):
    """Returns ``(fn, (params, opt_state, images, labels))`` for one Equinox ViT Adam step.

    Args:
        batch: ``B``, images per step.
        channels: ``C``, image channels.
        image: ``I``, the image side (square images); must be divisible by ``patch``.
        patch: ``P``, the patch side.
        layers: number of transformer blocks ``L``.
        d_model: ``D``, the token width; must be divisible by ``heads``.
        heads: ``H``, attention heads (``Dh = D / H``).
        d_ff: ``F``, MLP hidden width; ``None`` means ``4 * d_model``.
        classes: ``K``, output classes.
        learning_rate: Adam step size, a constant of the program.
        dtype: element type of the parameters and the images.

    Arguments of ``fn``:

    * ``params``: the array leaves of the model (``eqx.partition(model, eqx.is_array)``):
      ``patch_embedding.linear.weight [D, C P P], .bias [D]``, ``pos_embed [N, D]``, per block
      ``ln1``/``ln2`` ``weight, bias [D]``, ``attention.{query,key,value}_proj.weight [H Dh, D]``,
      ``attention.output_proj.weight [D, H Dh]``, ``linear1.weight [F, D], .bias [F]``,
      ``linear2.weight [D, F], .bias [D]``; ``norm``; ``head.weight [K, D], .bias [K]``;
    * ``opt_state``: ``optax.adam``'s state, ``(ScaleByAdamState(count: int32[], mu, nu),
      EmptyState())`` with ``mu`` and ``nu`` shaped like ``params``;
    * ``images``: ``dtype[B, C, I, I]``; ``labels``: ``int32[B]``.

    ``fn`` returns ``(loss: dtype[], new_params, new_opt_state)``.
    """
    if d_model % heads:
        raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
    if image % patch:
        raise ValueError(f"image={image} is not divisible by patch={patch}")
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    if d_ff is None:
        d_ff = 4 * d_model

    def init():
        model = VisionTransformer(channels=channels, image=image, patch=patch, d_model=d_model, heads=heads,
                                  d_ff=d_ff, layers=layers, classes=classes, dtype=dtype,
                                  key=jax.random.key(0))
        return eqx.partition(model, eqx.is_array)

    params, static = eqx.filter_eval_shape(init)
    tx = optax.adam(learning_rate)
    opt_state = jax.eval_shape(tx.init, params)

    def loss_fn(params, images, labels):
        model = eqx.combine(params, static)
        logits = jax.vmap(model)(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def train_step(params, opt_state, images, labels):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(params, images, labels)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = eqx.apply_updates(params, updates)
        return loss, params, opt_state

    images = jax.ShapeDtypeStruct((batch, channels, image, image), dtype)
    labels = jax.ShapeDtypeStruct((batch,), jnp.int32)
    return train_step, (params, opt_state, images, labels)
