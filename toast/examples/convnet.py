"""A small convolutional classifier: one full training step.

    step(params, images, labels) -> (loss, new_params)

Forward pass, NHWC images ``[B, H, W, C]`` and HWIO kernels:

* ``conv1``: 3x3, stride 1, ``SAME`` padding, ``C -> c1`` channels, bias, relu;
* max pooling 2x2, stride 2, with ``lax.reduce_window`` (``stablehlo.reduce_window``;
  its gradient is ``stablehlo.select_and_scatter``);
* ``conv2``: 3x3, stride 2, explicit padding ``((1, 1), (1, 1))``, ``c1 -> c2``, bias, relu;
* global average pooling (mean over the two spatial dimensions);
* dense layer ``[c2, classes]`` plus bias;
* softmax cross-entropy against integer ``labels: int32[B]`` (one-hot).

Backward: ``jax.value_and_grad``; the convolutions' gradients are themselves
``stablehlo.convolution`` ops with other dimension numbers (and, for the
strided one, ``lhs_dilation``).  Update: plain SGD.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["convnet"]

_DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")


def convnet(*, batch: int = 8, height: int = 32, width: int = 32, channels: int = 3,
            c1: int = 16, c2: int = 32, classes: int = 10, learning_rate: float = 1e-2,
            dtype=jnp.float32):
    """Returns ``(fn, (params, images, labels))`` for one CNN training step.

    Args:
        batch: ``B``, images per step.
        height, width: image size; ``height`` and ``width`` must be even (pooling).
        channels: ``C``, input channels.
        c1, c2: output channels of the two convolutions.
        classes: number of classes.
        learning_rate: SGD step size.
        dtype: element type of images and parameters.

    ``params`` is ``{conv1: {kernel: [3,3,C,c1], bias: [c1]}, conv2: {kernel: [3,3,c1,c2],
    bias: [c2]}, dense: {kernel: [c2, classes], bias: [classes]}}``.
    """

    def loss_fn(params, images, labels):
        h = lax.conv_general_dilated(images, params["conv1"]["kernel"], window_strides=(1, 1),
                                     padding="SAME", dimension_numbers=_DIMENSION_NUMBERS)
        h = jax.nn.relu(h + params["conv1"]["bias"])
        h = lax.reduce_window(h, -jnp.inf, lax.max, window_dimensions=(1, 2, 2, 1),
                              window_strides=(1, 2, 2, 1), padding="VALID")
        h = lax.conv_general_dilated(h, params["conv2"]["kernel"], window_strides=(2, 2),
                                     padding=((1, 1), (1, 1)),
                                     dimension_numbers=_DIMENSION_NUMBERS)
        h = jax.nn.relu(h + params["conv2"]["bias"])
        h = jnp.mean(h, axis=(1, 2))
        logits = h @ params["dense"]["kernel"] + params["dense"]["bias"]
        logp = jax.nn.log_softmax(logits, axis=-1)
        one_hot = jax.nn.one_hot(labels, classes, dtype=logp.dtype)
        return -jnp.mean(jnp.sum(one_hot * logp, axis=-1))

    def train_step(params, images, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
        new_params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
        return loss, new_params

    def spec(*shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    params = {
        "conv1": {"kernel": spec(3, 3, channels, c1), "bias": spec(c1)},
        "conv2": {"kernel": spec(3, 3, c1, c2), "bias": spec(c2)},
        "dense": {"kernel": spec(c2, classes), "bias": spec(classes)},
    }
    images = spec(batch, height, width, channels)
    labels = jax.ShapeDtypeStruct((batch,), jnp.int32)
    return train_step, (params, images, labels)
