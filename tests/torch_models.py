"""PyTorch model factories for ``tests/test_torch_frontend.py``, named as ``torch_models:tiny_llama`` (this folder is
on ``sys.path`` in the tests): each returns ``(torch.nn.Module, example_inputs)``, which toast traces as a training
step (``toast.frontend.torch_step``). torch and transformers are imported when a factory is called."""

from __future__ import annotations

from typing import Any


def tiny_llama(*, batch: int = 2, seq: int = 16, labels: bool = True, attn_implementation: str | None = None,
               use_cache: bool | None = None) -> tuple[Any, dict[str, Any]]:
    """A random Hugging Face ``LlamaForCausalLM`` (hidden 64, MLP 128, 2 layers, 4 heads of 16, 2 KV heads,
    vocabulary 256; seed 0) and ``{"input_ids": int64[batch, seq], "labels": int64[batch, seq]}`` (the labels are
    the input ids, which the model shifts itself). ``labels=False`` leaves them out: the output then has no loss.
    ``attn_implementation`` and ``use_cache``: the config's, where given (DTensor runs the model with ``"eager"``
    attention and no KV cache: ``tests/test_torch_dtensor.py``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
                         **({"attn_implementation": attn_implementation} if attn_implementation else {}),
                         **({"use_cache": use_cache} if use_cache is not None else {}))
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, ({"input_ids": ids, "labels": ids} if labels else {"input_ids": ids})


def tiny_vit(*, batch: int = 4, image: int = 32, labels: bool = True) -> tuple[Any, dict[str, Any]]:
    """A random Hugging Face ``ViTForImageClassification`` (hidden 64, MLP 128, 2 layers, 4 heads, 8x8 patches of a
    3-channel ``image`` x ``image`` picture, 10 classes; seed 0) and ``{"pixel_values": float32[batch, 3, image,
    image], "labels": int64[batch]}``: another family than Llama (a patch convolution, LayerNorm, GELU, a [CLS]
    token, no causal mask, a classification loss)."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       image_size=image, patch_size=8, num_labels=10, attn_implementation="eager")
    model = ViTForImageClassification(config)
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(batch, 3, image, image, generator=generator)
    classes = torch.randint(0, config.num_labels, (batch,), generator=generator)
    return model, ({"pixel_values": pixels, "labels": classes} if labels else {"pixel_values": pixels})
