"""A MaxText-like decoder LM training step in plain JAX: the programs of the published MaxText runs.

``../shared/reference/published/maxtext.json`` lists four published MaxText training runs (T6, T15 on
TPU v5e and v4 pods with MaxText's 2023 decoder; T11 on a TPU v6e pod and G1 on 128 H100s with Llama-2/3
70B). This module writes the step those runs took, the way MaxText writes it, without Flax:

    step(params, opt_state, tokens, targets) -> (loss, new_params, new_opt_state)

Shapes: ``B`` batch, ``S`` sequence, ``D`` model width, ``H`` query heads, ``K`` key/value heads (``K``
divides ``H``; ``K < H`` is grouped-query attention), ``Dh`` head width (not ``D / H``: MaxText's 2023
models have ``H x Dh = 8192 > D``), ``F`` MLP width, ``V`` vocabulary, ``L`` layers.

* Parameters are float32, the compute bfloat16 (MaxText's ``weight_dtype`` and ``dtype``): each weight
  is cast where it is used; RMSNorm (``x * rsqrt(mean(x^2) + 1e-6) * scale``) is computed in float32
  and cast back; the logits and the loss are float32.
* ``h = embed[tokens]`` (a ``gather``), then the ``L`` layers under one ``jax.lax.scan`` over the
  layer-stacked parameters (MaxText's ``scan_layers``; a leading ``L`` dim on every layer weight),
  the layer wrapped in ``jax.checkpoint`` with the run's remat policy (``prevent_cse=False``, as
  MaxText sets it under scan):

  - ``"full"``: ``jax.checkpoint_policies.nothing_saveable``, every activation recomputed;
  - ``"save:qkv"``: MaxText's ``qkv_proj_offloaded``,
    ``save_and_offload_only_these_names(names_which_can_be_saved=[], names_which_can_be_offloaded=
    ["query_proj", "key_proj", "value_proj"], offload_src="device", offload_dst="pinned_host")``, the
    three projections tagged with ``jax.ad_checkpoint.checkpoint_name`` as MaxText tags them. Lowered
    for ``tpu`` or ``gpu`` each tagged value becomes ``stablehlo.custom_call
    @annotate_device_placement`` with ``mhlo.frontend_attributes = {_xla_buffer_placement =
    "pinned_host"}`` in the forward loop (to the host) and ``{_xla_buffer_placement = "device"}``
    in the backward (back); lowered for ``cpu`` JAX drops the offload (no annotation).

* arch ``"mt2023"`` (MaxText's decoder of 2023, rows T6 and T15): one RMSNorm feeding a parallel
  block, ``h + attention(n) + mlp(n)`` with ``n = rms_norm(h)``; multi-head attention (``K = H``);
  a ReLU MLP ``relu(n @ wi) @ wo_mlp``; the final RMSNorm and the logits through the tied
  embedding, ``(h @ embed.T) / sqrt(D)`` (``normalize_embedding_logits``).
* arch ``"llama"`` (rows T11 and G1): pre-RMSNorm, ``h += attention(rms_norm(h))`` then
  ``h += mlp(rms_norm(h))``; grouped-query attention; SwiGLU ``(silu(n @ wi_0) * (n @ wi_1)) @
  wo_mlp``; an untied LM head ``h @ lm_head``.
* Attention, on ``q = x @ wq: [B,S,H,Dh]`` and ``k, v: [B,S,K,Dh]``, RoPE on ``q`` and ``k``
  (MaxText's form: the head dim's two halves rotated, ``theta = 10000``, tables ``[S, Dh/2]`` built
  once, outside the scan), ``q`` scaled by ``1/sqrt(Dh)``, causal, then ``out @ wo``:

  - ``"dot"``: plain attention, the scores ``[B,K,H/K,S,S]`` materialized (float32 softmax) (T15);
  - ``"flash"``: ``jax.experimental.pallas.ops.tpu.flash_attention`` on ``[B,H,S,Dh]`` (``k`` and
    ``v`` repeated to ``H`` heads where ``K < H``: the kernel takes equal heads) inside a
    ``jax.shard_map`` that splits the batch over ``shards`` devices, as MaxText called it in Dec
    2023 (T6);
  - ``"splash"``: ``jax.experimental.pallas.ops.tpu.splash_attention`` (``make_splash_mha`` of a
    ``MultiHeadMask`` of ``CausalMask``s, block sizes ``min(512, S)`` (128 where that does not divide
    ``S``), grouped-query ``k`` and ``v`` as they are), vmapped over the batch inside a
    ``jax.shard_map`` over ``shards`` devices, the kernel passed in with its
    ``manual_sharding_spec``, as MaxText calls it (T11);
  - ``"gpu_mha"``: ``jax.experimental.pallas.ops.gpu.attention.mha`` (Pallas GPU, Triton) at global
    shapes, ``k`` and ``v`` repeated to ``H`` heads, as MaxText's GPU ``flash`` path calls it. G1 ran
    cuDNN flash attention, which cannot be lowered without cuDNN; this Triton kernel stands in.

* Loss ``optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()``; update
  ``optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, b1=0.9, b2=0.95, eps=1e-8,
  weight_decay=0.1))`` (MaxText's defaults).

Parameters (``params``): ``embed [V,D]``, ``final_norm [D]``, ``lm_head [D,V]`` (llama only) and
``layers``, each leaf stacked along a leading ``L``: ``wq [L,D,H,Dh]``, ``wk`` and ``wv [L,D,K,Dh]``,
``wo [L,H,Dh,D]``, ``wo_mlp [L,F,D]``; mt2023 ``norm [L,D]``, ``wi [L,D,F]``; llama ``attn_norm``
and ``mlp_norm [L,D]``, ``wi_0`` and ``wi_1 [L,D,F]`` (argument names like
``params['layers']['wq']``). ``opt_state`` is optax's ``(EmptyState(), (ScaleByAdamState(count, mu,
nu), EmptyState(), EmptyState()))``.

Lowering. The TPU and GPU kernels lower only for their platform (``lowering_platforms``; no
accelerator is needed), which ``toast analyze module:function`` does not ask for: it lowers for the
host. ``stablehlo_text(...)`` (the factory's keywords) and ``row_text(row_id)`` lower for
``platform`` and return the StableHLO text; ``python -m benchmarks.programs.maxtext --row T6 -o
t6.mlir`` writes it for ``toast analyze t6.mlir``. ``maxtext(...)`` itself is a factory for
``toast analyze benchmarks.programs.maxtext:maxtext`` where the attention is ``"dot"`` (and ``row`` for
T15: ``toast analyze benchmarks.programs.maxtext:row --arg row_id=T15``).

Rows: ``row(row_id)`` is the factory of a maxtext.json row at its GLOBAL shapes (the global batch,
the row's attention and remat, ``platform`` ``tpu`` for T*, ``gpu`` for G1, ``shards`` its chips);
``row_settings(row_id)`` the keywords. Sizes: the defaults are tiny (``L=2, D=128``). With the layers
in a scan the lowered op count does not change with ``layers`` (nor any width).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name

from toast.errors import InputError

__all__ = ["ARCHS", "ATTENTIONS", "PLATFORMS", "PUBLISHED", "REMATS", "maxtext", "row", "row_settings",
           "row_text", "stablehlo_text"]

PUBLISHED = Path(__file__).resolve().parents[3] / "shared" / "reference" / "published" / "maxtext.json"
ARCHS = ("mt2023", "llama")
REMATS = ("full", "save:qkv")
ATTENTIONS = ("dot", "flash", "splash", "gpu_mha", "cudnn")
PLATFORMS = ("cpu", "tpu", "gpu")
# jax's names of the platforms to lower for.
LOWERING_PLATFORM = {"cpu": "cpu", "tpu": "tpu", "gpu": "cuda"}
# The platform each kernel lowers for ("dot" lowers for any).
KERNEL_PLATFORM = {"flash": "tpu", "splash": "tpu", "gpu_mha": "gpu", "cudnn": "gpu"}
# MaxText's checkpoint names of the q, k, v projections (what qkv_proj_offloaded offloads).
QKV_NAMES = ("query_proj", "key_proj", "value_proj")
SHARD_AXIS = "fsdp"  # the axis of the kernels' shard_map (MaxText's data x fsdp, tensor 1)
ROPE_THETA = 10_000.0
RMS_EPS = 1e-6
COMPUTE = jnp.bfloat16


def _rms_norm(x, scale):
    """MaxText's RMSNorm: in float32, cast back to the compute type, times the (cast) scale."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + RMS_EPS)
    return y.astype(COMPUTE) * scale.astype(COMPUTE)


def _rope_tables(seq: int, head_dim: int):
    """``(cos, sin)``, each ``[S, Dh/2]`` float32: angles ``position * theta ** (-2i / Dh)``."""
    fraction = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] / (ROPE_THETA ** fraction)[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def _apply_rope(x, cos, sin):
    """``x: [B, S, N, Dh]`` rotated by position, MaxText's form: halves ``(a, b) -> (a cos - b sin,
    b cos + a sin)``, in float32, cast back."""
    first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1).astype(x.dtype)


def _dot_attention(q, k, v):
    """Plain causal attention, ``q: [B,S,H,Dh]`` (already scaled), ``k, v: [B,S,K,Dh]``: grouped-query
    scores ``[B,K,H/K,S,S]`` in float32, softmax, back to ``[B,S,H,Dh]``."""
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(batch, seq, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k).astype(jnp.float32)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bkgqs,bskd->bqkgd", weights, v).reshape(batch, seq, heads, head_dim)


def _repeat_heads(x, heads: int):
    """``x: [B,S,K,Dh]`` with each key/value head repeated to ``heads`` (MaxText's GQA for equal-head kernels)."""
    return jnp.repeat(x, heads // x.shape[2], axis=2)


def _shard_mesh(shards: int):
    """The abstract mesh of the kernels' shard_map: one axis of ``shards`` devices that split the batch."""
    from jax.sharding import AbstractMesh, AxisType

    return AbstractMesh((shards,), (SHARD_AXIS,), axis_types=(AxisType.Auto,))


def _flash_attention(q, k, v, *, shards: int):
    """Pallas TPU flash attention (causal) on ``[B,H,S,Dh]``, in a shard_map over the batch (MaxText Dec 2023)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash
    from jax.sharding import PartitionSpec

    heads = q.shape[2]
    q, k, v = (jnp.transpose(x, (0, 2, 1, 3)) for x in (q, _repeat_heads(k, heads), _repeat_heads(v, heads)))
    spec = PartitionSpec(SHARD_AXIS, None, None, None)

    def attend(q, k, v):
        return tpu_flash.flash_attention(q, k, v, causal=True, sm_scale=1.0)

    out = jax.shard_map(attend, mesh=_shard_mesh(shards), in_specs=(spec, spec, spec), out_specs=spec,
                        check_vma=False)(q, k, v)
    return jnp.transpose(out, (0, 2, 1, 3))


def _splash_attention(q, k, v, *, shards: int):
    """Pallas TPU splash attention (causal) on ``[B,H,S,Dh]`` (``k, v`` with their own ``K`` heads), vmapped
    over the batch inside a shard_map over it, as MaxText calls it."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
    from jax.sharding import NamedSharding, PartitionSpec

    q, k, v = (jnp.transpose(x, (0, 2, 1, 3)) for x in (q, k, v))
    heads, seq = q.shape[1], q.shape[2]
    block = min(512, seq) if seq % min(512, seq) == 0 else 128  # MaxText's min(512, S), where it tiles S
    blocks = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                               block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    mask = splash_mask.MultiHeadMask(masks=(splash_mask.CausalMask(shape=(seq, seq)),) * heads)
    kernel = splash.make_splash_mha(mask=mask, head_shards=1, q_seq_shards=1, block_sizes=blocks)
    mesh = _shard_mesh(shards)
    kernel_spec = kernel.manual_sharding_spec(NamedSharding(mesh, PartitionSpec(None, None)))
    spec = PartitionSpec(SHARD_AXIS, None, None, None)

    def attend(q, k, v, kernel):
        return jax.vmap(kernel)(q, k, v)

    out = jax.shard_map(attend, mesh=mesh, in_specs=(spec, spec, spec, kernel_spec), out_specs=spec,
                        check_vma=False)(q, k, v, kernel)
    return jnp.transpose(out, (0, 2, 1, 3))


def _gpu_mha(q, k, v):
    """Pallas GPU (Triton) flash attention, causal, on ``[B,S,H,Dh]`` at global shapes."""
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention

    heads = q.shape[2]
    return gpu_attention.mha(q, _repeat_heads(k, heads), _repeat_heads(v, heads), segment_ids=None, sm_scale=1.0,
                             causal=True)


def _attention(x, p, cos, sin, *, attention: str, shards: int, repeat_kv: bool):
    """Self-attention of ``x: [B,S,D]`` with the layer's ``wq, wk, wv, wo``; ``[B,S,D]``."""
    head_dim = p["wq"].shape[-1]
    q = checkpoint_name(jnp.einsum("bsd,dhk->bshk", x, p["wq"].astype(COMPUTE)), "query_proj")
    k = checkpoint_name(jnp.einsum("bsd,dhk->bshk", x, p["wk"].astype(COMPUTE)), "key_proj")
    v = checkpoint_name(jnp.einsum("bsd,dhk->bshk", x, p["wv"].astype(COMPUTE)), "value_proj")
    q = _apply_rope(q, cos, sin) * jnp.asarray(1 / math.sqrt(head_dim), COMPUTE)
    k = _apply_rope(k, cos, sin)
    if repeat_kv:
        k, v = _repeat_heads(k, q.shape[2]), _repeat_heads(v, q.shape[2])
    if attention == "dot":
        out = _dot_attention(q, k, v)
    elif attention == "flash":
        out = _flash_attention(q, k, v, shards=shards)
    elif attention == "splash":
        out = _splash_attention(q, k, v, shards=shards)
    elif attention == "cudnn":  # cuDNN's fused attention (lowers only on a GPU machine with cuDNN)
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=1.0, implementation="cudnn")
    else:
        out = _gpu_mha(q, k, v)
    return jnp.einsum("bshk,hkd->bsd", out, p["wo"].astype(COMPUTE))


def _mlp(x, p):
    """MaxText's MlpBlock: ReLU (``wi``) or SwiGLU (``wi_0``, ``wi_1``), then ``wo_mlp``."""
    if "wi" in p:
        hidden = jax.nn.relu(x @ p["wi"].astype(COMPUTE))
    else:
        hidden = jax.nn.silu(x @ p["wi_0"].astype(COMPUTE)) * (x @ p["wi_1"].astype(COMPUTE))
    return hidden @ p["wo_mlp"].astype(COMPUTE)


def _layer(h, p, cos, sin, *, arch: str, attention: str, shards: int, repeat_kv: bool):
    """One decoder layer on the residual stream ``h: [B,S,D]`` (bf16)."""
    attend = functools.partial(_attention, cos=cos, sin=sin, attention=attention, shards=shards, repeat_kv=repeat_kv)
    if arch == "mt2023":  # one norm, attention and MLP in parallel
        n = _rms_norm(h, p["norm"])
        return h + attend(n, p) + _mlp(n, p)
    h = h + attend(_rms_norm(h, p["attn_norm"]), p)
    return h + _mlp(_rms_norm(h, p["mlp_norm"]), p)


def _remat_policy(remat: str) -> Callable[..., Any]:
    """The ``jax.checkpoint`` policy of a run's remat setting (module docstring)."""
    if remat == "full":
        return jax.checkpoint_policies.nothing_saveable
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=list(QKV_NAMES), offload_src="device",
        offload_dst="pinned_host")


def _check(*, arch: str, d: int, heads: int, kv_heads: int, head_dim: int, mlp: int, layers: int, vocab: int,
           batch: int, seq: int, remat: str, attention: str, platform: str, shards: int) -> None:
    """One ``InputError`` line for settings the program cannot be built with."""
    for name, value, known in (("arch", arch, ARCHS), ("remat", remat, REMATS), ("attention", attention, ATTENTIONS),
                               ("platform", platform, PLATFORMS)):
        if value not in known:
            raise InputError(f"maxtext: {name} {value!r}: give one of {', '.join(known)}")
    sizes = {"d": d, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "mlp": mlp, "layers": layers,
             "vocab": vocab, "batch": batch, "seq": seq, "shards": shards}
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InputError(f"maxtext: {name} {size!r}: give a whole number, 1 or more")
    if heads % kv_heads or head_dim % 2:
        raise InputError(f"maxtext: need kv_heads | heads and an even head_dim; got heads={heads}, "
                         f"kv_heads={kv_heads}, head_dim={head_dim}")
    if arch == "mt2023" and kv_heads != heads:
        raise InputError(f"maxtext: arch mt2023 is multi-head attention: kv_heads ({kv_heads}) must equal heads "
                         f"({heads})")
    wanted = KERNEL_PLATFORM.get(attention)
    if wanted is not None and platform != wanted:
        raise InputError(f"maxtext: attention {attention} is a {wanted} kernel; give platform={wanted} "
                         f"(got {platform})")
    if wanted is not None and seq % 128:
        raise InputError(f"maxtext: attention {attention} tiles the sequence in blocks of 128; seq {seq} is not a "
                         "multiple of 128")
    if batch % shards:
        raise InputError(f"maxtext: the kernels' shard_map splits the batch ({batch}) over {shards} shards, "
                         "which do not divide it")


def maxtext(*, arch: str = "llama", d: int = 128, heads: int = 4, kv_heads: int = 2, head_dim: int = 64,
            mlp: int = 256, layers: int = 2, vocab: int = 256, batch: int = 4, seq: int = 128,
            remat: str = "full", attention: str = "dot", platform: str = "cpu", shards: int = 1,
            repeat_kv: bool = False, learning_rate: float = 3e-4):
    """Returns ``(fn, (params, opt_state, tokens, targets))`` for one MaxText-like training step.

    Args:
        arch: ``"mt2023"`` (parallel block, ReLU MLP, tied embedding; ``kv_heads == heads``) or
            ``"llama"`` (pre-norm, GQA, SwiGLU, untied).
        d: ``D``, the residual width.
        heads: ``H``, query heads.
        kv_heads: ``K``, key/value heads; divides ``heads``.
        head_dim: ``Dh``, each head's width; even (RoPE rotates halves).
        mlp: ``F``, the MLP width (each of SwiGLU's two input projections).
        layers: ``L``, decoder layers (stacked, run by ``jax.lax.scan``).
        vocab: ``V``, vocabulary size.
        batch: ``B``, sequences per step (the global batch).
        seq: ``S``, tokens per sequence; a multiple of 128 for the kernels.
        remat: ``"full"`` or ``"save:qkv"`` (module docstring).
        attention: ``"dot"``, ``"flash"``, ``"splash"`` (TPU kernels), ``"gpu_mha"`` (a GPU kernel) or ``"cudnn"``
            (cuDNN's fused attention through ``jax.nn.dot_product_attention``: lowers only where cuDNN is).
        platform: ``"cpu"``, ``"tpu"`` or ``"gpu"``: what ``stablehlo_text`` lowers for; a kernel needs its own.
        shards: devices the flash and splash kernels' shard_map splits the batch over (the devices the
            program runs on, as MaxText's mesh); divides ``batch``.
        repeat_kv: repeat ``k`` and ``v`` to ``H`` heads before the attention (grouped-query ``dot`` and
            ``splash`` take them as they are; ``flash`` and ``gpu_mha`` always repeat: their kernels take
            equal heads). toast's splash rules group k's and v's heads under the query's
            (rules/ops/kernels.dl), so grouped-query splash is priced as MaxText calls it, without this.
        learning_rate: AdamW's step size, a constant of the program.

    ``fn(params, opt_state, tokens, targets)`` takes ``tokens, targets: int32[B, S]``, the float32
    parameters and optax's state, and returns ``(loss: float32[], new_params, new_opt_state)``.

    Raises:
        InputError: one line: an unknown arch, remat, attention or platform, a size that is not a whole
            number of at least 1, heads ``kv_heads`` does not divide, an odd ``head_dim``, GQA in mt2023, a
            kernel on another platform or with ``seq`` not a multiple of 128, or ``shards`` that do not divide
            ``batch``.
    """
    _check(arch=arch, d=d, heads=heads, kv_heads=kv_heads, head_dim=head_dim, mlp=mlp, layers=layers, vocab=vocab,
           batch=batch, seq=seq, remat=remat, attention=attention, platform=platform, shards=shards)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(learning_rate, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1))
    policy = _remat_policy(remat)

    def loss_fn(params, tokens, targets):
        cos, sin = _rope_tables(seq, head_dim)

        def layer(h, p):
            return _layer(h, p, cos, sin, arch=arch, attention=attention, shards=shards, repeat_kv=repeat_kv), None

        h = params["embed"].astype(COMPUTE)[tokens]
        h, _ = jax.lax.scan(jax.checkpoint(layer, policy=policy, prevent_cse=False), h, params["layers"])
        h = _rms_norm(h, params["final_norm"])
        if arch == "mt2023":  # logits through the tied embedding, normalized by sqrt(D)
            logits = (h @ params["embed"].astype(COMPUTE).T) / jnp.asarray(math.sqrt(d), COMPUTE)
        else:
            logits = h @ params["lm_head"].astype(COMPUTE)
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()

    def init(key):
        keys = iter(jax.random.split(key, 12))

        def normal(*shape):
            return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

        def ones(*shape):
            return jnp.ones(shape, jnp.float32)

        stacked = {"wq": normal(layers, d, heads, head_dim), "wk": normal(layers, d, kv_heads, head_dim),
                   "wv": normal(layers, d, kv_heads, head_dim), "wo": normal(layers, heads, head_dim, d),
                   "wo_mlp": normal(layers, mlp, d)}
        params: dict[str, Any] = {"embed": normal(vocab, d), "final_norm": ones(d)}
        if arch == "mt2023":
            stacked |= {"norm": ones(layers, d), "wi": normal(layers, d, mlp)}
        else:
            stacked |= {"attn_norm": ones(layers, d), "mlp_norm": ones(layers, d), "wi_0": normal(layers, d, mlp),
                        "wi_1": normal(layers, d, mlp)}
            params["lm_head"] = normal(d, vocab)
        params["layers"] = stacked
        return params

    def train_step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    params = jax.eval_shape(init, jax.random.PRNGKey(0))
    opt_state = jax.eval_shape(optimizer.init, params)
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    targets = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return train_step, (params, opt_state, tokens, targets)


def stablehlo_text(**settings: Any) -> str:
    """The StableHLO text (with debug locations: argument names) of ``maxtext(**settings)`` lowered for its
    ``platform`` (``tpu``, ``cuda`` for ``gpu``, ``cpu``), the kernels' shard_map mesh in context."""
    fn, args = maxtext(**settings)
    platform = settings.get("platform", "cpu")
    with jax.sharding.use_abstract_mesh(_shard_mesh(settings.get("shards", 1))):
        traced = jax.jit(fn).trace(*args)
        return traced.lower(lowering_platforms=(LOWERING_PLATFORM[platform],)).as_text(debug_info=True)


def _rows(published: str | Path | None) -> dict[str, dict[str, Any]]:
    """maxtext.json's rows by id."""
    path = Path(published) if published is not None else PUBLISHED
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise InputError(f"{path}: cannot read the published MaxText runs: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: not JSON: {err.msg}") from None
    return {entry["id"]: entry for entry in data["rows"]}


# maxtext.json's attention text -> this module's attention.
_ATTENTION_OF = (("splash", "splash"), ("flash attention (jax.experimental.pallas.ops.tpu", "flash"),
                 ("plain dot-product", "dot"), ("cuDNN flash", "gpu_mha"))


def row_settings(row_id: str, *, published: str | Path | None = None) -> dict[str, Any]:
    """``maxtext``'s keywords for maxtext.json row ``row_id`` at its global shapes: its config, the global batch,
    its remat and attention (cuDNN: ``gpu_mha``), platform ``gpu`` for an H100 row (else ``tpu``), ``shards``
    its chips.

    Raises:
        InputError: no such row (the message lists them), or the file cannot be read.
    """
    rows = _rows(published)
    if row_id not in rows:
        raise InputError(f"maxtext: no row {row_id!r} in maxtext.json (rows: {', '.join(rows)})")
    entry = rows[row_id]
    config = entry["config"]
    attention = next(ours for text, ours in _ATTENTION_OF if text in entry["attention"])
    return {"arch": config["arch"], "d": config["d"], "heads": config["heads"], "kv_heads": config["kv_heads"],
            "head_dim": config["head_dim"], "mlp": config["mlp"], "layers": config["layers"],
            "vocab": config["vocab"], "batch": config["global_batch"], "seq": config["seq"],
            "remat": config["remat"], "attention": attention,
            "platform": "gpu" if "H100" in entry["accelerator"] else "tpu", "shards": entry["chips"]}


def row(row_id: str, *, published: str | Path | None = None):
    """``maxtext(**row_settings(row_id))``: the factory of a maxtext.json row (``--arg row_id=T15``)."""
    return maxtext(**row_settings(row_id, published=published))


def row_text(row_id: str, *, published: str | Path | None = None) -> str:
    """The StableHLO text of a maxtext.json row's step, lowered for its platform."""
    return stablehlo_text(**row_settings(row_id, published=published))


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.programs.maxtext --row T6 -o t6.mlir``: write a row's lowered step."""
    parser = argparse.ArgumentParser(description="Write a maxtext.json row's training step as StableHLO.")
    parser.add_argument("--row", required=True, help="a row id of maxtext.json (T6, T15, T11, G1)")
    parser.add_argument("--published", default=None, help=f"maxtext.json (default {PUBLISHED})")
    parser.add_argument("-o", "--output", required=True, help="the .mlir file to write")
    parser.add_argument("--attention", choices=ATTENTIONS, default=None,
                        help="another attention than the row's (cudnn: on a GPU machine with cuDNN)")
    options = parser.parse_args(argv)
    try:
        settings = row_settings(options.row, published=options.published)
        if options.attention:
            settings["attention"] = options.attention
        text = stablehlo_text(**settings)
    except InputError as err:
        print(f"toast: error: {err}", file=sys.stderr)
        return 2
    Path(options.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
