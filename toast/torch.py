"""The PyTorch path's public API (``pip install 'toast[torch]'``): shard a ``torch.nn.Module``'s training step.

    >>> import toast.torch
    >>> from toast.examples.torch_gpt import gpt
    >>> module, inputs = gpt()                      # a torch.nn.Module and forward's keyword arguments
    >>> strategy = toast.torch.autoshard(module, inputs, "batch=4,model=2", hardware="h100",
    ...                                  seed=0)   # doctest: +SKIP
    >>> strategy.cost["step_time_s"]                # doctest: +SKIP

The step toast shards is ``toast.frontend.torch_step.training_step``'s: forward, the loss (the output's ``.loss``
or ``loss(output, *inputs)``), its gradient and an optax optimizer step (AdamW with torch's defaults), traced
through torchax, the parameters named by their ``state_dict`` names (``params['model']['layers'][0]...`` in the
strategy's ``partition_specs``). Like ``toast/__init__.py`` this module only re-exports and composes the stages'
functions; torch is imported when a function is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from toast.frontend.torch_step import default_optimizer, step_arguments, training_step

if TYPE_CHECKING:
    from toast.output.autoshard import Strategy
    from toast.sharding.mesh import Mesh

__all__ = ["autoshard", "default_optimizer", "step_arguments", "training_step"]


def autoshard(module: Any, example_inputs: Any, mesh: str | Mesh, *, loss: Callable[..., Any] | None = None,
              optimizer: Any = None, **settings: Any) -> Strategy:
    """Find a sharding of ``module``'s training step for ``mesh``: ``toast.autoshard`` on the step
    ``training_step(module, example_inputs, loss=loss, optimizer=optimizer)`` traces.

    Args:
      module: a ``torch.nn.Module``.
      example_inputs: ``forward``'s arguments: a tuple, or a dict of keyword arguments (``input_ids``,
        ``labels``); their shapes are the step's (the batch is the global batch).
      mesh: ``"batch=4,model=2"`` or a ``toast.Mesh``.
      loss: ``loss(output, *inputs)`` (``**inputs`` for a dict), a scalar torch tensor; default the output's
        ``.loss``.
      optimizer: an optax ``GradientTransformation``; default ``default_optimizer()`` (AdamW, torch's defaults).
      settings: ``toast.autoshard``'s keyword settings (``hardware``, ``seed``, ``rollouts``, ``memory_gib``,
        ``search``, ...).

    Returns:
      the strategy, its ``partition_specs`` keyed by the step's argument names (``params[...]`` in the
      ``state_dict``'s nesting, ``opt_state...``, the inputs by ``forward``'s parameter names).

    Raises:
      InputError: torch, torchax or optax missing, inputs, loss or optimizer unusable, or tracing failed.
      ToastError: ``toast.autoshard``'s errors.
    """
    from toast.output.autoshard import autoshard as autoshard_step

    fn, example_args = training_step(module, example_inputs, loss=loss, optimizer=optimizer)
    return autoshard_step(fn, *example_args, mesh=mesh, **settings)
