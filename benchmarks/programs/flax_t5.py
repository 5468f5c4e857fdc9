"""A Hugging Face ``FlaxT5ForConditionalGeneration`` training step, as users write it.

Nothing here is written for toast: the model is the ``transformers`` (4.x) Flax T5, built from a
small ``T5Config`` with ``_do_init=False`` (no weights are downloaded or allocated: the parameter
shapes come from ``jax.eval_shape`` of ``model.init_weights``), and the step is the usual
``jax.value_and_grad`` of a cross-entropy loss followed by an ``optax.adam`` update:

    step(params, opt_state, input_ids, attention_mask, decoder_input_ids, labels)
        -> (loss, new_params, new_opt_state)

Model (``B`` batch, ``S`` source tokens, ``T`` target tokens, ``D`` model width, ``H`` heads,
``Dkv`` the per-head width, ``F`` the feed-forward width, ``V`` vocabulary), as the
``transformers`` code computes it:

* encoder: ``shared [V, D]`` embedding (``gather``), then ``num_layers`` pre-RMSNorm blocks
  (``T5LayerNorm``: no mean, no bias) of self-attention (``q, k, v: [D, H * Dkv]``,
  ``o: [H * Dkv, D]``, no biases, no ``1/sqrt(Dkv)`` scaling) with a bucketed relative position
  bias (``relative_attention_bias [32, H]``, first layer only, reused by the others) and the
  padding mask from ``attention_mask``, and a ReLU feed-forward ``wi [D, F]``, ``wo [F, D]``;
  a final RMSNorm;
* decoder: the same embedding, ``num_decoder_layers`` blocks of causal self-attention (its own
  relative bias), cross-attention over the encoder output (``EncDecAttention``) and the
  feed-forward; a final RMSNorm;
* LM head tied to ``shared`` (T5's default ``tie_word_embeddings``): ``logits = (h * D^-0.5)
  @ shared.T``, ``[B, T, V]``;
* loss: ``optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()``.

Update: ``optax.adam(1e-4)``; ``opt_state`` is optax's ``(ScaleByAdamState(count, mu, nu),
EmptyState())``. Dropout is 0, so the step runs the model with ``train=False``.

Parameters (``params``, the nested dict Flax builds): ``shared.embedding``; per block,
``params['encoder']['block']['0']['layer']['0']['SelfAttention']['q']['kernel']`` (and ``k``,
``v``, ``o``), ``...['layer']['0']['layer_norm']['weight']``,
``...['layer']['1']['DenseReluDense']['wi']['kernel']`` (``wo``); in the decoder ``layer['1']``
is ``EncDecAttention`` and ``layer['2']`` the feed-forward.

Sizes: the defaults are tiny (2 + 2 layers, ``D=64``) so that ``toast analyze`` takes
seconds. T5-small is

    flax_t5(layers=6, decoder_layers=6, d_model=512, d_kv=64, heads=8, d_ff=2048, vocab=32128,
            source_len=512, target_len=128, batch=32)

Needs ``transformers`` 4.x with Flax, imported when the factory is called. transformers 4.57's
Flax T5 calls ``jnp.clip(x, a_max=...)``, a keyword JAX 0.10 no longer takes; the factory gives
that module a ``jnp`` whose ``clip`` accepts it (the workaround a user on these versions writes).
"""

from __future__ import annotations

import functools
import inspect
import types

import jax
import jax.numpy as jnp
import optax

__all__ = ["flax_t5"]


def _clip(x, a_min=None, a_max=None, *, min=None, max=None):  # noqa: A002 - jnp.clip's names
    return jnp.clip(x, a_min if min is None else min, a_max if max is None else max)


def _accept_old_clip_keywords() -> None:
    """Lets transformers' Flax T5 call ``jnp.clip(x, a_max=...)`` under a JAX whose clip lost it."""
    from transformers.models.t5 import modeling_flax_t5

    if "a_max" in inspect.signature(jnp.clip).parameters or isinstance(modeling_flax_t5.jnp, types.SimpleNamespace):
        return
    shim = types.SimpleNamespace(**{name: getattr(jnp, name) for name in dir(jnp) if not name.startswith("__")})
    shim.clip = _clip
    modeling_flax_t5.jnp = shim


def flax_t5(*, layers: int = 2, decoder_layers: int = 2, d_model: int = 64, d_kv: int = 16, heads: int = 4,
            d_ff: int = 256, vocab: int = 512, source_len: int = 32, target_len: int = 16, batch: int = 8,
            learning_rate: float = 1e-4):
    """Returns ``(fn, (params, opt_state, input_ids, attention_mask, decoder_input_ids, labels))``
    for one T5 training step.

    Args:
        layers: encoder blocks.
        decoder_layers: decoder blocks.
        d_model: ``D``, the model width.
        d_kv: ``Dkv``, each head's query/key/value width (``H * Dkv`` need not be ``D``).
        heads: ``H``, attention heads.
        d_ff: ``F``, the feed-forward width.
        vocab: ``V``, the vocabulary (the tied embedding's rows).
        source_len: ``S``, encoder tokens per example.
        target_len: ``T``, decoder tokens per example.
        batch: ``B``, examples per step.
        learning_rate: the Adam step size, a constant of the program.

    ``fn`` takes ``input_ids, attention_mask: int32[B, S]``, ``decoder_input_ids, labels:
    int32[B, T]``, the Flax parameter dict and optax's Adam state, and returns ``(loss:
    float32[], new_params, new_opt_state)``.
    """
    from transformers import FlaxT5ForConditionalGeneration, T5Config

    _accept_old_clip_keywords()
    config = T5Config(vocab_size=vocab, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers,
                      num_decoder_layers=decoder_layers, num_heads=heads, dropout_rate=0.0)
    input_shape = (batch, source_len)
    model = FlaxT5ForConditionalGeneration(config, input_shape=input_shape, _do_init=False)
    optimizer = optax.adam(learning_rate)

    def loss_fn(params, input_ids, attention_mask, decoder_input_ids, labels):
        logits = model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                       params=params, train=False).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def train_step(params, opt_state, input_ids, attention_mask, decoder_input_ids, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, input_ids, attention_mask, decoder_input_ids, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return loss, params, opt_state

    params = jax.eval_shape(functools.partial(model.init_weights, input_shape=input_shape), jax.random.PRNGKey(0))
    opt_state = jax.eval_shape(optimizer.init, params)
    input_ids = jax.ShapeDtypeStruct((batch, source_len), jnp.int32)
    attention_mask = jax.ShapeDtypeStruct((batch, source_len), jnp.int32)
    decoder_input_ids = jax.ShapeDtypeStruct((batch, target_len), jnp.int32)
    labels = jax.ShapeDtypeStruct((batch, target_len), jnp.int32)
    return train_step, (params, opt_state, input_ids, attention_mask, decoder_input_ids, labels)
