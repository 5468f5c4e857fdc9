"""A small GPT written in plain PyTorch: the bundled example of the PyTorch path (``pip install 'toast[torch]'``).

``gpt()`` is a factory that returns ``(module, example_inputs)``, a ``torch.nn.Module`` and the keyword arguments of
its ``forward``; toast traces one training step of it through torchax (``toast.frontend.torch_step``: the loss
``forward`` returns, AdamW) and shards that step as it shards a JAX program::

    toast compare toast.examples.torch_gpt:gpt --mesh batch=4,model=2

The model (``B`` batch, ``S`` sequence, ``D`` width, ``H`` heads of ``D / H``, ``F = 4 D``, ``V`` vocabulary):
token and learned position embeddings, ``layers`` pre-LayerNorm blocks (causal self-attention written out with
``matmul`` and ``softmax``, a GELU MLP), a final LayerNorm, an untied ``lm_head`` and ``forward(input_ids, labels)
-> loss``: the cross-entropy of the next token, averaged over ``B * (S - 1)``. Parameters are named as a PyTorch user
names them (``blocks.0.attn.q_proj.weight``, ``[out, in]`` as ``nn.Linear`` stores them).

The model is ``toast.examples.torch_gpt_model``; torch is imported when the factory is called, never with
``toast.examples``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["gpt"]


def gpt(*, batch: int = 8, seq: int = 32, width: int = 64, heads: int = 4, layers: int = 2, vocab: int = 256,
        seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """A random ``TorchGPT`` (seed ``seed``) and ``{"input_ids": int64[batch, seq], "labels": int64[batch, seq]}``
    (uniform random token ids; the labels are the ids, shifted by the model)."""
    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")
    import torch

    from toast.examples.torch_gpt_model import TorchGPT

    torch.manual_seed(seed)
    model = TorchGPT(width=width, heads=heads, layers=layers, vocab=vocab, max_seq=seq)
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed + 1))
    return model, {"input_ids": ids, "labels": ids.clone()}
