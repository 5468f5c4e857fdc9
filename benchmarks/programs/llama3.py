"""A Llama-3-style decoder LM training step in plain JAX, its layers unrolled in a Python loop.

The model of ``scan_llama`` (same attention, MLP, RMSNorm, rotary tables, loss and
``optax.adam`` update; its helpers are imported from there), written the way users write a
Llama-3 step without ``jax.lax.scan``: every layer has its own parameter dict, and a Python
``for`` loop calls each layer wrapped in ``jax.checkpoint`` (remat per layer: the backward pass
recomputes the layer's activations instead of storing them):

    step(params, opt_state, tokens, targets) -> (loss, new_params, new_opt_state)

Parameters (``params``, a dict): ``embed: [V, D]``, ``final_norm: [D]``, ``lm_head: [D, V]``
and ``layers``, a list of ``L`` dicts, one per layer, with ``attn_norm: [D], wq: [D,H,Dh],
wk: [D,K,Dh], wv: [D,K,Dh], wo: [H,Dh,D], mlp_norm: [D], w_gate: [D,F], w_up: [D,F],
w_down: [F,D]`` (argument names like ``params['layers'][0]['wq']``, and the Adam moments
``opt_state[0].mu['layers'][0]['wq']``). See ``scan_llama`` for the forward pass.

Sizes: the defaults are tiny (``L=2, D=64``) so that ``toast analyze`` takes seconds. The
benchmark size is Llama-3-8B's (dim 4096, 32 layers, 32 query heads of 128, 8 key/value
heads, SwiGLU width 14336, vocabulary 128256), at sequence 8192 and batch 16:

    toast autoshard benchmarks.programs.llama3:llama3 --arg layers=32 --arg d_model=4096 \\
        --arg heads=32 --arg kv_heads=8 --arg ffn=14336 --arg vocab=128256 --arg seq=8192 \\
        --arg batch=16 --mesh dp=8,tp=8 --hardware h100

8.03G parameters (525M of them in the embedding and as many in the LM head). With the layers
unrolled the op count grows with ``layers`` (715 ops a layer, 325 besides; not with any
width): the defaults lower to 1755 ops, the benchmark size to 23205 (876 arguments).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from benchmarks.programs.scan_llama import _adam_step, _decoder_layer, _head_width, _rms_norm, _rope_tables

__all__ = ["llama3"]


def llama3(*, layers: int = 2, d_model: int = 64, heads: int = 4, kv_heads: int = 2, ffn: int = 128,
           vocab: int = 256, seq: int = 32, batch: int = 8, learning_rate: float = 3e-4):
    """Returns ``(fn, (params, opt_state, tokens, targets))`` for one Llama-3-style training step.

    The arguments are ``scan_llama``'s, but for ``layers``: ``L`` decoder layers, unrolled, each under
    ``jax.checkpoint``; ``fn`` takes and returns what ``scan_llama``'s does, the layers' parameters a list.
    """
    head_dim = _head_width(d_model, heads, kv_heads)
    optimizer = optax.adam(learning_rate)

    def loss_fn(params, tokens, targets):
        cos, sin = _rope_tables(seq, head_dim)

        @jax.checkpoint
        def layer(h, p):
            return _decoder_layer(h, p, cos, sin)

        h = params["embed"][tokens]
        for p in params["layers"]:
            h = layer(h, p)
        logits = _rms_norm(h, params["final_norm"]) @ params["lm_head"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def init(key):
        keys = iter(jax.random.split(key, 2 + 7 * layers))

        def normal(*shape):
            return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

        return {
            "embed": normal(vocab, d_model),
            "layers": [{
                "attn_norm": jnp.ones((d_model,), jnp.float32),
                "wq": normal(d_model, heads, head_dim),
                "wk": normal(d_model, kv_heads, head_dim),
                "wv": normal(d_model, kv_heads, head_dim),
                "wo": normal(heads, head_dim, d_model),
                "mlp_norm": jnp.ones((d_model,), jnp.float32),
                "w_gate": normal(d_model, ffn),
                "w_up": normal(d_model, ffn),
                "w_down": normal(ffn, d_model),
            } for _ in range(layers)],
            "final_norm": jnp.ones((d_model,), jnp.float32),
            "lm_head": normal(d_model, vocab),
        }

    return _adam_step(loss_fn, init, optimizer, batch=batch, seq=seq)
