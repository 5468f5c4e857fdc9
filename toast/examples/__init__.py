"""Bundled example programs.

Each example is a *factory*: a function that takes keyword-only size settings (all with
defaults) and returns ``(fn, args)``, where ``fn`` is a plain JAX function and ``args`` a
tuple of ``jax.ShapeDtypeStruct`` pytrees (no memory is allocated).  Lower one with

    fn, args = load("mlp")                  # or load("toast.examples.mlp:mlp")
    text = jax.jit(fn).lower(*args).as_text(debug_info=True)

``debug_info=True`` keeps argument names as ``loc("x")`` and pytree paths such as
``loc("params['blocks'][0]['wq']")``.

``EXAMPLES`` names every factory as a ``module:function`` spec, usable on a command line;
``DESCRIPTIONS`` has a one-line description of each.  Tests: ``tests/test_examples.py``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

__all__ = ["EXAMPLES", "DESCRIPTIONS", "resolve", "load", "op_counts"]

EXAMPLES: dict[str, str] = {
    "mlp": "toast.examples.mlp:mlp",
    "transpose_matmul": "toast.examples.transpose_matmul:transpose_matmul",
    "attention": "toast.examples.attention:attention",
    "gpt": "toast.examples.gpt:gpt_train_step",
    "gpt_small": "toast.examples.gpt:gpt_small",
    "gpt_scan": "toast.examples.gpt:gpt_scan",
    "convnet": "toast.examples.convnet:convnet",
    "gnn": "toast.examples.gnn:gnn",
    "ops_zoo": "toast.examples.ops_zoo:ops_zoo",
    "ops_zoo_extras": "toast.examples.ops_zoo:ops_zoo_extras",
    # The paper's evaluation models (section 5.1), at its sizes and small for tests.
    "t2b": "toast.examples.gemma:t2b",
    "t7b": "toast.examples.gemma:t7b",
    "gemma_small": "toast.examples.gemma:gemma_small",
    "itx": "toast.examples.itx:itx",
    "itx_prefill": "toast.examples.itx:itx_prefill",
    "itx_small": "toast.examples.itx:itx_small",
    "itx_prefill_small": "toast.examples.itx:itx_prefill_small",
    "gns": "toast.examples.gns:gns",
    "gns_small": "toast.examples.gns:gns_small",
    "unet": "toast.examples.unet:unet",
    "unet_small": "toast.examples.unet:unet_small",
}

DESCRIPTIONS: dict[str, str] = {
    "mlp": "Figure 2a: x[256,32] @ w1[32,64], relu, @ w2[64,16] (6 ops, 4 colors).",
    "transpose_matmul": "Section 2.2's f: z = x @ x.T on x[32,4], the smallest sharding conflict.",
    "attention": "Figure 5a: simplified attention with averaging in place of softmax (conflicts).",
    "gpt": "GPT-2-small-shaped training step (loss, grads, SGD); layers/scan_layers keywords.",
    "gpt_small": "A 2-layer GPT training step at tiny sizes (B=2, S=16, D=64, H=4, V=128).",
    "gpt_scan": "gpt_small with the blocks under jax.lax.scan (stablehlo.while).",
    "convnet": "Small CNN training step: strided/padded convolutions, max pool, dense, softmax CE.",
    "gnn": "GNN training step: gather by senders, segment_sum (scatter) by receivers.",
    "ops_zoo": "One program covering every StableHLO op kind the analysis handles.",
    "ops_zoo_extras": "ops_zoo plus chlo ops (square, erfc, top_k, ...) and complex-valued fft.",
    "t2b": "Gemma-2B training step with Adam (T2B): RMSNorm, RoPE, multi-query attention, GeGLU, tied embedding.",
    "t7b": "Gemma-7B training step with Adam (T7B): as t2b with multi-head attention, D=3072, 28 layers.",
    "gemma_small": "A 2-layer Gemma-style training step at tiny sizes (D=64, H=4, one KV head).",
    "itx": "Inference transformer decode step (ITX): RoPE, multi-query attention, KV cache update.",
    "itx_prefill": "ITX prefill: a 1024-token prompt with causal attention, filling the KV cache.",
    "itx_small": "A 2-layer ITX decode step at tiny sizes.",
    "itx_prefill_small": "A 2-layer ITX prefill at tiny sizes.",
    "gns": "Graph network simulator step with Adam (GNS): encode, 24 message-passing steps, decode.",
    "gns_small": "GNS with 2 message-passing steps at tiny sizes (32 nodes, 128 edges).",
    "unet": "Diffusion U-Net training step with Adam: 9 down, 12 up residual blocks, 32-head attention.",
    "unet_small": "A U-Net step at tiny sizes (8x8 images, 2 levels, 4 heads).",
}

Factory = Callable[..., "tuple[Callable[..., Any], tuple[Any, ...]]"]


def resolve(spec: str) -> Factory:
    """Returns the factory named by ``spec``: a key of ``EXAMPLES`` or ``module:function``."""
    spec = EXAMPLES.get(spec, spec)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(sorted(EXAMPLES))
        raise ValueError(f"unknown example {spec!r}: expected one of {known} or 'module:function'")
    from toast.errors import InputError
    from toast.frontend.loading import resolve_factory

    try:
        return resolve_factory(spec)
    except InputError as err:
        raise ValueError(str(err)) from None


def load(spec: str, **settings: Any):
    """Calls the factory named by ``spec`` with ``settings``; returns ``(fn, args)``."""
    return resolve(spec)(**settings)


def op_counts(text: str) -> collections.Counter[str]:
    """Counts ``stablehlo.*`` and ``chlo.*`` ops in StableHLO text, all functions and regions
    included, by walking the module with the MLIR Python bindings.

    Region terminators (``stablehlo.return``) are not counted, so a ``reduce`` whose body
    adds counts one ``reduce`` and one ``add``; ``func.call`` and ``func.return`` are not
    ``stablehlo`` ops and are not counted either.
    """
    from jax.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    counts: collections.Counter[str] = collections.Counter()

    def visit(operation) -> None:
        name = operation.name
        if name.startswith(("stablehlo.", "chlo.")) and name != "stablehlo.return":
            counts[name] += 1
        for region in operation.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner.operation)

    context = jax_mlir.make_ir_context()
    with context:
        module = ir.Module.parse(text, context=context)
        visit(module.operation)
    return counts
