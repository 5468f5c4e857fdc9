"""Frontier-size Llama training steps: Llama-3-70B and Llama-3.1-405B shapes, layers unrolled, remat per layer.

Both are ``llama3``'s step (plain JAX, every layer its own parameter dict, a Python ``for`` loop over the
layers each under ``jax.checkpoint``, ``optax.adam``) at the shapes of the public model cards; the
factories' defaults are those shapes, and every size can be given smaller (a test lowers them tiny):

* ``llama3_70b``: 80 layers, dim 8192, 64 query heads of 128, 8 key/value heads, SwiGLU width 28672,
  vocabulary 128256; sequence 2048, batch 256 (524,288 tokens a step). 70.6G parameters.
  ``toast autoshard benchmarks.programs.frontier:llama3_70b --mesh data=128,model=8 --hardware h100``
  (1024 devices).
* ``llama31_405b``: 126 layers, dim 16384, 128 query heads of 128, 8 key/value heads, SwiGLU width 53248,
  vocabulary 128256; sequence 2048, batch 1024 (2M tokens a step). 405.9G parameters.
  ``toast autoshard benchmarks.programs.frontier:llama31_405b --mesh data=64,seq=8,model=8 --hardware h100``
  (4096 devices over three axes), or on four axes, 8192 devices: ``--mesh data=16,fsdp=32,seq=2,model=8``.

Op counts grow with the layers only (``llama3``'s 715 ops a layer and 325 besides): 70B lowers to 57,525
ops, 405B to 90,415; arguments: 9 parameters a layer and 3 besides, each with its two Adam moments, plus the
step count, the tokens and the targets (70B: 2,172; 405B: 3,414). Their analyses have 330,209 and 519,453
dimension names. ``benchmarks/bench_frontier.py`` runs the whole ``toast autoshard`` on both and reports CPU
seconds, peak memory and the seconds of each stage.

The roles file beside this module (``frontier.roles.toml``) is ``llama3``'s: the parameters have the same
names and layouts.
"""

from __future__ import annotations

from benchmarks.programs.llama3 import llama3

__all__ = ["llama31_405b", "llama3_70b"]

SEQ = 2048
VOCAB = 128256


def llama3_70b(*, layers: int = 80, d_model: int = 8192, heads: int = 64, kv_heads: int = 8, ffn: int = 28672,
               vocab: int = VOCAB, seq: int = SEQ, batch: int = 256):
    """``(fn, (params, opt_state, tokens, targets))``: one training step of a Llama-3-70B-shaped model
    (``llama3``'s step; the defaults are the model card's shapes, any can be given smaller)."""
    return llama3(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab, seq=seq,
                  batch=batch)


def llama31_405b(*, layers: int = 126, d_model: int = 16384, heads: int = 128, kv_heads: int = 8,
                 ffn: int = 53248, vocab: int = VOCAB, seq: int = SEQ, batch: int = 1024):
    """``(fn, (params, opt_state, tokens, targets))``: one training step of a Llama-3.1-405B-shaped model
    (``llama3``'s step; the defaults are the model card's shapes, any can be given smaller)."""
    return llama3(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab, seq=seq,
                  batch=batch)
