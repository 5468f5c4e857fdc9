"""A small message-passing graph network: one full training step.

    step(params, nodes, senders, receivers, labels) -> (loss, new_params)

Inputs: node features ``nodes: [N, F]``, an edge list ``senders, receivers: int32[E]``
and per-node class ``labels: int32[N]``.

Forward pass:

* node encoder ``h0 = relu(nodes @ w + b)`` (``[N, F] -> [N, H]``);
* messages ``m = h0[senders]`` (``stablehlo.gather``), then an MLP on each edge,
  ``m = relu(m @ w + b)`` twice (``[E, H] -> [E, H]``);
* aggregation ``agg = jax.ops.segment_sum(m, receivers, N)`` (a ``stablehlo.scatter``
  with an ``add`` body);
* update ``h = relu(concat([h0, agg]) @ w + b)`` (``[N, 2H] -> [N, H]``);
* readout ``logits = h @ w + b`` (``[N, classes]``), softmax cross-entropy.

The gradient reaches ``h0`` through the gather, so backward turns the gather into a
scatter-add and the segment-sum into a gather: the step has two of each.  Update: plain
SGD.  The edge dimension ``E`` and the node dimension ``N`` are linked only through index
arrays, which is what makes gather and scatter interesting to shard.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["gnn"]


def gnn(*, nodes: int = 64, edges: int = 256, features: int = 16, hidden: int = 32,
        classes: int = 4, learning_rate: float = 1e-2, dtype=jnp.float32):
    """Returns ``(fn, (params, nodes, senders, receivers, labels))`` for one GNN step.

    Args:
        nodes: ``N``, number of graph nodes.
        edges: ``E``, number of directed edges.
        features: ``F``, input node-feature width.
        hidden: ``H``, message and node-state width.
        classes: number of node classes.
        learning_rate: SGD step size.
        dtype: element type of features and parameters.

    ``params`` is ``{encoder, message_1, message_2, update, readout}``, each ``{w, b}``.
    """
    num_nodes = nodes

    def dense(p, x):
        return x @ p["w"] + p["b"]

    def loss_fn(params, nodes, senders, receivers, labels):
        h0 = jax.nn.relu(dense(params["encoder"], nodes))
        messages = h0[senders]
        messages = jax.nn.relu(dense(params["message_1"], messages))
        messages = jax.nn.relu(dense(params["message_2"], messages))
        aggregated = jax.ops.segment_sum(messages, receivers, num_segments=num_nodes)
        h = jax.nn.relu(dense(params["update"], jnp.concatenate([h0, aggregated], axis=-1)))
        logits = dense(params["readout"], h)
        logp = jax.nn.log_softmax(logits, axis=-1)
        one_hot = jax.nn.one_hot(labels, classes, dtype=logp.dtype)
        return -jnp.mean(jnp.sum(one_hot * logp, axis=-1))

    def train_step(params, nodes, senders, receivers, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, nodes, senders, receivers, labels)
        new_params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
        return loss, new_params

    def layer(d_in, d_out):
        return {"w": jax.ShapeDtypeStruct((d_in, d_out), dtype),
                "b": jax.ShapeDtypeStruct((d_out,), dtype)}

    params = {
        "encoder": layer(features, hidden),
        "message_1": layer(hidden, hidden),
        "message_2": layer(hidden, hidden),
        "update": layer(2 * hidden, hidden),
        "readout": layer(hidden, classes),
    }
    args = (
        params,
        jax.ShapeDtypeStruct((num_nodes, features), dtype),  # nodes
        jax.ShapeDtypeStruct((edges,), jnp.int32),           # senders
        jax.ShapeDtypeStruct((edges,), jnp.int32),           # receivers
        jax.ShapeDtypeStruct((num_nodes,), jnp.int32),       # labels
    )
    return train_step, args
