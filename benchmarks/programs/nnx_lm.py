"""A decoder-only language model written with Flax NNX: one Adam training step.

The model is written the way Flax NNX users write one: ``nnx.Module`` classes built from
``nnx.Embed``, ``nnx.Linear`` and ``nnx.LayerNorm``, the blocks held in an ``nnx.List``,
the causal self-attention written out with ``nnx.Linear`` projections (nanoGPT-style).
The training step takes plain pytrees: ``graphdef, params = nnx.split(model)`` outside,
``nnx.merge(graphdef, params)`` inside, so the jitted program sees only arrays.

    step(params, opt_state, inputs, targets) -> (loss, new_params, new_opt_state)

Forward pass (``B`` batch, ``S`` sequence, ``D`` model width, ``H`` heads,
``Dh = D / H``, ``F = 4 D`` MLP width, ``V`` vocabulary, ``L`` layers):

* ``h = token_embed(inputs) + pos_embed(arange(S))`` (``nnx.Embed``: a gather each);
* ``L`` pre-LayerNorm blocks, ``h += attn(ln_1(h))``, ``h += mlp(ln_2(h))``:

  - attention: ``q, k, v = query(x), key(x), value(x)`` (``nnx.Linear`` ``D -> D``),
    reshaped to ``[B, S, H, Dh]``, scores ``einsum('bqhd,bkhd->bhqk') / sqrt(Dh)``, a causal
    mask (``nnx.make_causal_mask``), ``jax.nn.softmax``, ``einsum('bhqk,bkhd->bqhd')``,
    merged to ``[B, S, D]`` and projected by ``out`` (``nnx.Linear`` ``D -> D``);
  - MLP: ``fc_out(gelu(fc_in(x)))`` (``D -> F -> D``);

* final ``nnx.LayerNorm``, an untied head ``lm_head`` (``nnx.Linear`` ``D -> V``, no bias);
* loss: ``optax.softmax_cross_entropy_with_integer_labels`` averaged over ``B * S``.

Update: ``jax.value_and_grad`` of the loss with respect to ``params``, then ``optax.adam``
(``tx.update`` and ``optax.apply_updates``); the Adam state holds a step count and the first
and second moments ``mu`` and ``nu``, each shaped like ``params``.

Argument names (as ``toast analyze`` prints them) follow the ``nnx.State`` paths, e.g.
``params['blocks'][0]['attn']['query']['kernel'].value`` (``[D, D]``),
``params['blocks'][0]['mlp']['fc_in']['kernel'].value`` (``[D, F]``),
``opt_state[0].mu['lm_head']['kernel'].value``, ``inputs`` and ``targets`` (``int32[B, S]``).

Default sizes are small, so that ``toast analyze`` takes seconds: ``L=2, D=64, H=8, S=32,
B=8, V=256``. The benchmark size is GPT-2 small::

    nnx_lm(layers=12, d_model=768, heads=12, seq=1024, batch=16, vocab=50304)

Only shapes are built (``nnx.eval_shape``, ``jax.eval_shape``): sizes cost nothing until the
program is compiled, and the op count depends only on ``layers``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

__all__ = ["nnx_lm"]


class CausalSelfAttention(nnx.Module):
    """Multi-head causal self-attention: ``D -> D`` projections for q, k, v and the output."""

    def __init__(self, d_model: int, heads: int, *, dtype, rngs: nnx.Rngs):
        self.heads = heads
        self.query = nnx.Linear(d_model, d_model, param_dtype=dtype, rngs=rngs)
        self.key = nnx.Linear(d_model, d_model, param_dtype=dtype, rngs=rngs)
        self.value = nnx.Linear(d_model, d_model, param_dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        batch, seq, d_model = x.shape
        head_dim = d_model // self.heads
        q = self.query(x).reshape(batch, seq, self.heads, head_dim)
        k = self.key(x).reshape(batch, seq, self.heads, head_dim)
        v = self.value(x).reshape(batch, seq, self.heads, head_dim)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
        mask = nnx.make_causal_mask(jnp.ones((batch, seq), dtype=jnp.int32))  # [B, 1, S, S]
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, d_model)
        return self.out(out)


class MLP(nnx.Module):
    """``fc_out(gelu(fc_in(x)))``, ``D -> F -> D``."""

    def __init__(self, d_model: int, d_ff: int, *, dtype, rngs: nnx.Rngs):
        self.fc_in = nnx.Linear(d_model, d_ff, param_dtype=dtype, rngs=rngs)
        self.fc_out = nnx.Linear(d_ff, d_model, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.fc_out(jax.nn.gelu(self.fc_in(x)))


class Block(nnx.Module):
    """A pre-LayerNorm transformer block."""

    def __init__(self, d_model: int, heads: int, d_ff: int, *, dtype, rngs: nnx.Rngs):
        self.ln_1 = nnx.LayerNorm(d_model, param_dtype=dtype, rngs=rngs)
        self.attn = CausalSelfAttention(d_model, heads, dtype=dtype, rngs=rngs)
        self.ln_2 = nnx.LayerNorm(d_model, param_dtype=dtype, rngs=rngs)
        self.mlp = MLP(d_model, d_ff, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class LanguageModel(nnx.Module):
    """Token and learned position embeddings, ``L`` blocks, a final LayerNorm, an untied head."""

    def __init__(self, *, vocab: int, seq: int, d_model: int, heads: int, d_ff: int, layers: int,
                 dtype, rngs: nnx.Rngs):
        self.token_embed = nnx.Embed(vocab, d_model, param_dtype=dtype, rngs=rngs)
        self.pos_embed = nnx.Embed(seq, d_model, param_dtype=dtype, rngs=rngs)
        self.blocks = nnx.List([Block(d_model, heads, d_ff, dtype=dtype, rngs=rngs) for _ in range(layers)])
        self.ln_f = nnx.LayerNorm(d_model, param_dtype=dtype, rngs=rngs)
        self.lm_head = nnx.Linear(d_model, vocab, use_bias=False, param_dtype=dtype, rngs=rngs)

    def __call__(self, tokens):
        positions = jnp.arange(tokens.shape[1])
        h = self.token_embed(tokens) + self.pos_embed(positions)
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.ln_f(h))


def nnx_lm(*, layers: int = 2, batch: int = 8, seq: int = 32, d_model: int = 64, heads: int = 8,
           vocab: int = 256, d_ff: int | None = None, learning_rate: float = 3e-4, dtype=jnp.float32):
    """Returns ``(fn, (params, opt_state, inputs, targets))`` for one NNX language-model Adam step.

    Args:
        layers: number of transformer blocks ``L``.
        batch: ``B``, sequences per step.
        seq: ``S``, tokens per sequence (also the rows of ``pos_embed``).
        d_model: ``D``, the residual width; must be divisible by ``heads``.
        heads: ``H``, attention heads (``Dh = D / H``).
        vocab: ``V``, vocabulary size (``token_embed`` rows, ``lm_head`` columns).
        d_ff: ``F``, MLP hidden width; ``None`` means ``4 * d_model``.
        learning_rate: Adam step size, a constant of the program.
        dtype: element type of the parameters.

    Arguments of ``fn``:

    * ``params``: the ``nnx.State`` of ``nnx.split(model)``: ``token_embed.embedding [V, D]``,
      ``pos_embed.embedding [S, D]``, per block ``ln_1``/``ln_2`` ``scale, bias [D]``,
      ``attn.{query,key,value,out}`` ``kernel [D, D], bias [D]``, ``mlp.fc_in`` ``kernel
      [D, F], bias [F]``, ``mlp.fc_out`` ``kernel [F, D], bias [D]``; ``ln_f``; ``lm_head.kernel
      [D, V]``;
    * ``opt_state``: ``optax.adam``'s state, ``(ScaleByAdamState(count: int32[], mu, nu),
      EmptyState())`` with ``mu`` and ``nu`` shaped like ``params``;
    * ``inputs``, ``targets``: ``int32[B, S]`` (the tokens and the next tokens).

    ``fn`` returns ``(loss: dtype[], new_params, new_opt_state)``.
    """
    if d_model % heads:
        raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    if d_ff is None:
        d_ff = 4 * d_model

    abstract_model = nnx.eval_shape(lambda: LanguageModel(
        vocab=vocab, seq=seq, d_model=d_model, heads=heads, d_ff=d_ff, layers=layers, dtype=dtype,
        rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract_model)
    tx = optax.adam(learning_rate)
    opt_state = jax.eval_shape(tx.init, params)

    def loss_fn(params, inputs, targets):
        model = nnx.merge(graphdef, params)
        logits = model(inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def train_step(params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return loss, params, opt_state

    inputs = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    targets = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return train_step, (params, opt_state, inputs, targets)
