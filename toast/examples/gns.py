"""An encode-process-decode graph network simulator (GNS): one full Adam training step.

The model of "Learning to simulate complex physics with graph networks" (Sanchez-Gonzalez
et al., 2020; Battaglia et al.'s graph networks), the TOAST paper's GNS (section 5.1):

    step(params, opt_state, nodes, edge_features, senders, receivers, targets)
        -> (loss, new_params, new_opt_state)

Inputs (``N`` nodes, ``E`` edges, ``Fn``/``Fe`` node/edge feature widths, ``L`` latent,
``Hd`` hidden, ``O`` output width): node features ``nodes: [N, Fn]``, edge features
``edge_features: [E, Fe]`` (given, not computed: in the original they are the relative
displacement and distance of the two particles, which is a few elementwise ops on node
positions gathered by the same index arrays), the edge list ``senders, receivers: int32[E]``
and per-node target accelerations ``targets: [N, O]``.

Every MLP has ``mlp_layers`` linear layers (default 3) with ReLU between them,
``d_in -> Hd -> ... -> Hd -> d_out``; all but the decoder end in a LayerNorm.

* encode: ``v = node_encoder(nodes)`` (``[N, Fn] -> [N, L]``),
  ``e = edge_encoder(edge_features)`` (``[E, Fe] -> [E, L]``);
* process, ``steps`` message-passing steps (each with its own parameters), each

  - edge update ``m = edge_mlp(concat([e, v[senders], v[receivers]]))``
    (``[E, 3L] -> [E, L]``; the two ``v[...]`` are ``stablehlo.gather``),
  - aggregation ``agg = jax.ops.segment_sum(m, receivers, N)`` (``[E, L] -> [N, L]``, a
    ``stablehlo.scatter`` with an ``add`` body),
  - node update ``v' = node_mlp(concat([v, agg]))`` (``[N, 2L] -> [N, L]``),
  - residuals ``e += m`` and ``v += v'``;
* decode: ``acc = decoder(v)`` (``[N, L] -> [N, O]``, no LayerNorm);
* loss: mean squared error against ``targets``.

Backward (``jax.value_and_grad``) turns every gather into a scatter-add and every
segment-sum into a gather.  Update: Adam written out in ``jnp`` (``b1 = 0.9``,
``b2 = 0.999``, ``eps = 1e-8``): ``opt_state = {count: int32[], mu, nu}`` with ``mu``, ``nu``
shaped like ``params``; ``count`` is the number of updates made so far.  With
``t = count + 1``: ``mu = b1 mu + (1 - b1) g``, ``nu = b2 nu + (1 - b2) g*g`` and
``p -= lr sqrt(1 - b2^t) / (1 - b1^t) * mu / (sqrt(nu) + eps)`` (the bias corrections folded
into one scalar step size; ``b^t`` is ``exp(t log b)``).

Parameters (``params``, a dict; argument names read like
``params['processor'][3]['edge_w1']`` and ``opt_state['mu']['processor'][3]['edge_w1']``):

* ``node_encoder``, ``edge_encoder``: ``w1, b1, ..., wK, bK, ln_scale, ln_bias``;
* ``processor``: a list of ``steps`` dicts with ``edge_w1, edge_b1, ..., edge_ln_scale,
  edge_ln_bias`` and ``node_w1, ..., node_ln_bias``;
* ``decoder``: ``w1, b1, ..., wK, bK``.

Sizes: ``gns()`` is the paper's GNS: 2048 nodes, 65536 edges (the paper uses 8192 to
65536), 24 message-passing steps of 3-layer MLPs, hidden 1024, latent 2048, with 16 node
and 4 edge input features and 3 outputs.  The paper gives about 875M parameters; this reading
of its sizes has 412,525,571 (403,046,400 in the processor: each step's edge MLP has
9,445,376 and its node MLP 7,348,224; the encoders and the decoder about 3.2M each), and
the Adam moments twice that again.  ``gns_small()`` is a tiny graph for tests.
Only shapes are built (``jax.ShapeDtypeStruct``), so sizes cost nothing until compiled.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from toast.examples.adam import adam_state, adam_update

__all__ = ["gns_train_step", "gns", "gns_small"]


def _layer_norm(x, scale, bias, eps: float = 1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    # ``centered * centered`` rather than ``jnp.square``, which lowers to ``chlo.square``.
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * jax.lax.rsqrt(var + eps) * scale + bias


def _mlp(p: dict[str, Any], x, layers: int, prefix: str = "", norm: bool = True):
    """``layers`` linear layers ``p[prefix + 'w1'], ...`` with ReLU between, then LayerNorm."""
    for i in range(1, layers + 1):
        x = x @ p[f"{prefix}w{i}"] + p[f"{prefix}b{i}"]
        if i < layers:
            x = jax.nn.relu(x)
    if norm:
        x = _layer_norm(x, p[f"{prefix}ln_scale"], p[f"{prefix}ln_bias"])
    return x


def gns_train_step(*, nodes: int = 2048, edges: int = 65536, node_features: int = 16,
                   edge_features: int = 4, latent: int = 2048, hidden: int = 1024, steps: int = 24,
                   mlp_layers: int = 3, out_features: int = 3, dtype=jnp.float32,
                   learning_rate: float = 1e-4):
    """Returns ``(fn, (params, opt_state, nodes, edge_features, senders, receivers, targets))``.

    Args:
        nodes: ``N``, graph nodes (particles).
        edges: ``E``, directed edges.
        node_features: ``Fn``, input node-feature width.
        edge_features: ``Fe``, input edge-feature width.
        latent: ``L``, width of node and edge latents (every MLP's output but the decoder's).
        hidden: ``Hd``, width of the MLPs' hidden layers.
        steps: message-passing steps, each with its own edge and node MLPs.
        mlp_layers: linear layers per MLP (at least 1).
        out_features: ``O``, decoded per-node outputs (accelerations).
        dtype: element type of features, parameters and Adam moments.
        learning_rate: Adam step size, a constant of the program.

    ``fn`` returns ``(loss: dtype[], new_params, new_opt_state)``, shaped like its inputs.
    """
    if mlp_layers < 1:
        raise ValueError(f"mlp_layers must be at least 1, got {mlp_layers}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    num_nodes = nodes

    def loss_fn(params, nodes, edge_features, senders, receivers, targets):
        v = _mlp(params["node_encoder"], nodes, mlp_layers)
        e = _mlp(params["edge_encoder"], edge_features, mlp_layers)
        for p in params["processor"]:
            m = _mlp(p, jnp.concatenate([e, v[senders], v[receivers]], axis=-1), mlp_layers, "edge_")
            aggregated = jax.ops.segment_sum(m, receivers, num_segments=num_nodes)
            v = v + _mlp(p, jnp.concatenate([v, aggregated], axis=-1), mlp_layers, "node_")
            e = e + m
        diff = _mlp(params["decoder"], v, mlp_layers, norm=False) - targets
        return jnp.mean(diff * diff)

    def train_step(params, opt_state, nodes, edge_features, senders, receivers, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, nodes, edge_features, senders, receivers, targets)
        new_params, new_opt_state = adam_update(params, grads, opt_state, learning_rate)
        return loss, new_params, new_opt_state

    def spec(*shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    def mlp(d_in, d_out, prefix="", norm=True):
        widths = [d_in] + [hidden] * (mlp_layers - 1) + [d_out]
        p = {}
        for i in range(1, mlp_layers + 1):
            p[f"{prefix}w{i}"] = spec(widths[i - 1], widths[i])
            p[f"{prefix}b{i}"] = spec(widths[i])
        if norm:
            p[f"{prefix}ln_scale"] = spec(d_out)
            p[f"{prefix}ln_bias"] = spec(d_out)
        return p

    params = {
        "node_encoder": mlp(node_features, latent),
        "edge_encoder": mlp(edge_features, latent),
        "processor": [{**mlp(3 * latent, latent, "edge_"), **mlp(2 * latent, latent, "node_")}
                      for _ in range(steps)],
        "decoder": mlp(latent, out_features, norm=False),
    }
    args = (
        params,
        adam_state(params),
        spec(num_nodes, node_features),                  # nodes
        spec(edges, edge_features),                      # edge_features
        jax.ShapeDtypeStruct((edges,), jnp.int32),       # senders
        jax.ShapeDtypeStruct((edges,), jnp.int32),       # receivers
        spec(num_nodes, out_features),                   # targets
    )
    return train_step, args


def gns(**overrides: Any):
    """The paper's GNS (section 5.1): N=2048, E=65536, 24 steps, 3-layer MLPs, Hd=1024, L=2048."""
    settings: dict[str, Any] = dict(nodes=2048, edges=65536, node_features=16, edge_features=4,
                                    latent=2048, hidden=1024, steps=24, mlp_layers=3, out_features=3)
    return gns_train_step(**{**settings, **overrides})


def gns_small(**overrides: Any):
    """A tiny GNS step for tests: N=32, E=128, Fn=8, Fe=4, L=16, Hd=32, 2 steps; 17,091 parameters."""
    settings: dict[str, Any] = dict(nodes=32, edges=128, node_features=8, edge_features=4,
                                    latent=16, hidden=32, steps=2, mlp_layers=3, out_features=3)
    return gns_train_step(**{**settings, **overrides})
