"""A Hugging Face ``FlaxWhisperForConditionalGeneration`` training step, as users write it.

Nothing here is written for toast: the model is the ``transformers`` Flax Whisper (an
encoder-decoder speech model), built from a ``WhisperConfig`` with ``_do_init=False`` (no
weights are downloaded or allocated; the parameter shapes come from ``jax.eval_shape`` of
``model.init_weights``), and the step is the usual ``jax.value_and_grad`` of a cross-entropy
loss followed by an ``optax.adam`` update:

    step(params, opt_state, input_features, decoder_input_ids, labels)
        -> (loss, new_params, new_opt_state)

Model (``B`` batch, ``M`` mel bins, ``S`` encoder positions, ``T`` decoder positions, ``D``
model width, ``H`` heads, ``F`` MLP width, ``V`` vocabulary), as the ``transformers`` code
computes it:

* encoder: ``input_features: [B, M, 2S]`` transposed to ``[B, 2S, M]``, two 1-D
  convolutions of width 3 (``stablehlo.convolution``; the second of stride 2, down to ``S``
  frames), exact (erf) GELU after each, plus a sinusoidal position table (a parameter whose
  gradient is stopped), then ``encoder_layers`` pre-LayerNorm blocks: self-attention (``q``,
  ``k``, ``v`` and ``out`` projections are ``nn.Dense`` with ``[D, D]`` kernels, heads split by
  a reshape to ``[B, S, H, D/H]``; ``k_proj`` has no bias) and a GELU MLP ``fc1: [D, F]``,
  ``fc2: [F, D]``; a final LayerNorm;
* decoder: token embedding ``[V, D]`` (``gather``) plus a learned position embedding
  ``[T, D]``, then ``decoder_layers`` blocks of causal self-attention (the mask sliced from a
  ``max_target_positions`` square), cross-attention over the encoder output
  (``encoder_attn``) and the GELU MLP; a final LayerNorm;
* LM head tied to the token embedding (``tie_word_embeddings``, Whisper's default):
  ``logits = h @ embed.T``, ``[B, T, V]``;
* loss: ``optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()``.

Update: ``optax.adam(1e-4)``; ``opt_state`` is optax's ``(ScaleByAdamState(count, mu, nu),
EmptyState())``, ``mu`` and ``nu`` shaped like ``params``. Dropout is 0 in ``WhisperConfig``,
so the step runs the model with ``train=False`` (the same arithmetic, no dropout key).

Parameters (``params``, the nested dict Flax builds): ``params['model']['encoder']`` holds
``conv1``, ``conv2``, ``embed_positions``, ``layer_norm`` and ``layers['0']``,
``layers['1']``, ... each with ``self_attn`` (``q_proj``, ``k_proj``, ``v_proj``,
``out_proj``), ``self_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``;
``params['model']['decoder']`` holds ``embed_tokens``, ``embed_positions``, ``layer_norm``
and ``layers[...]`` with, besides those, ``encoder_attn`` and ``encoder_attn_layer_norm``.
Argument names are pytree paths such as
``params['model']['decoder']['layers']['0']['self_attn']['q_proj']['kernel']``.

Sizes: the defaults are tiny (2 + 2 layers, ``D=64``) so that ``toast analyze`` takes
seconds. The benchmark size, "whisper-base with 8 + 8 layers", is

    hf_whisper(encoder_layers=8, decoder_layers=8, d_model=512, heads=8, ffn=2048,
               vocab=51865, mel_bins=80, source_positions=1500, target_len=448, batch=8)

(``toast analyze benchmarks.programs.hf_whisper:hf_whisper --arg encoder_layers=8 ...``):
18955 ops (the "20k-op" benchmark) and 87M parameters. Flax Whisper unrolls its layers (no
scan), so the op count grows with the layers (5413 ops for the default 2 + 2) and does not
depend on the widths. Whisper's vocabulary, 51865, is odd: the vocabulary dim cannot be
split.

Needs ``transformers`` (with Flax), imported when the factory is called.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

__all__ = ["hf_whisper"]


def hf_whisper(*, encoder_layers: int = 2, decoder_layers: int = 2, d_model: int = 64, heads: int = 4,
               ffn: int = 256, vocab: int = 512, mel_bins: int = 80, source_positions: int = 64,
               target_len: int = 16, batch: int = 8, learning_rate: float = 1e-4):
    """Returns ``(fn, (params, opt_state, input_features, decoder_input_ids, labels))`` for one
    Whisper training step.

    Args:
        encoder_layers: encoder blocks.
        decoder_layers: decoder blocks.
        d_model: ``D``, the model width of encoder and decoder.
        heads: ``H``, attention heads of every attention (``D`` divisible by ``H``).
        ffn: ``F``, the MLP hidden width (``fc1: [D, F]``).
        vocab: ``V``, the decoder's vocabulary (embedding rows, tied LM head).
        mel_bins: ``M``, mel channels of the input features.
        source_positions: ``S``, encoder positions; the input features have ``2S`` frames
            (the second convolution has stride 2).
        target_len: ``T``, decoder tokens per example; also ``max_target_positions`` (the rows
            of the decoder's position embedding).
        batch: ``B``, examples per step.
        learning_rate: the Adam step size, a constant of the program.

    ``fn(params, opt_state, input_features, decoder_input_ids, labels)`` takes
    ``input_features: float32[B, M, 2S]``, ``decoder_input_ids, labels: int32[B, T]``, the
    Flax parameter dict and optax's Adam state, and returns ``(loss: float32[], new_params,
    new_opt_state)`` shaped like its inputs.
    """
    from transformers import FlaxWhisperForConditionalGeneration, WhisperConfig

    config = WhisperConfig(
        vocab_size=vocab, num_mel_bins=mel_bins, d_model=d_model,
        encoder_layers=encoder_layers, decoder_layers=decoder_layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
        max_source_positions=source_positions, max_target_positions=target_len,
    )
    input_shape = (batch, mel_bins, 2 * source_positions)
    model = FlaxWhisperForConditionalGeneration(config, input_shape=input_shape, _do_init=False)
    optimizer = optax.adam(learning_rate)

    def loss_fn(params, input_features, decoder_input_ids, labels):
        logits = model(input_features, decoder_input_ids, params=params, train=False).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def train_step(params, opt_state, input_features, decoder_input_ids, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, input_features, decoder_input_ids, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return loss, params, opt_state

    params = jax.eval_shape(functools.partial(model.init_weights, input_shape=input_shape), jax.random.PRNGKey(0))
    opt_state = jax.eval_shape(optimizer.init, params)
    input_features = jax.ShapeDtypeStruct(input_shape, jnp.float32)
    decoder_input_ids = jax.ShapeDtypeStruct((batch, target_len), jnp.int32)
    labels = jax.ShapeDtypeStruct((batch, target_len), jnp.int32)
    return train_step, (params, opt_state, input_features, decoder_input_ids, labels)
