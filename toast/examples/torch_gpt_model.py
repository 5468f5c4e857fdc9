"""The model of ``toast.examples.torch_gpt``, plain PyTorch (this module imports torch: the factory imports it when
called, so ``toast.examples`` never needs torch)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


class Attention(nn.Module):
    """Causal self-attention, written out: ``q @ k^T / sqrt(D/H)``, a causal mask, softmax, ``@ v``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.o_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        head = width // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:  # [B, S, D] -> [B, H, S, D/H]
            return t.view(batch, seq, self.heads, head).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scores = q @ k.transpose(-2, -1) / head ** 0.5
        causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    """A pre-LayerNorm block: ``x + attn(ln_1(x))``, then ``x + proj(gelu(fc(ln_2(x))))``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(functional.gelu(self.fc(self.ln_2(x))))


class TorchGPT(nn.Module):
    """``forward(input_ids, labels) -> loss``: the mean cross-entropy of the next token (``int64[B, S]`` ids and
    labels; the labels are shifted by one here)."""

    def __init__(self, *, width: int, heads: int, layers: int, vocab: int, max_seq: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(max_seq, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        vocab = logits.shape[-1]
        return functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1))
