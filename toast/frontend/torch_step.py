"""A PyTorch module's training step as a JAX function, traced through torchax (``pip install 'toast[torch]'``).

``training_step(module, example_inputs)`` returns ``(fn, example_args)`` for ``jax.jit(fn).lower(*example_args)``,
as a JAX factory does; the program it lowers to is one step of training::

    fn(params, opt_state, *inputs) -> (params, opt_state, loss)

* ``params``: the module's trained parameters (``requires_grad``) as a nested pytree of its ``state_dict`` names,
  one dict level per dotted component, and a list where the components of a level are ``0 .. n-1`` (a
  ``ModuleList``: ``model.layers.0.mlp.up_proj.weight`` is ``params['model']['layers'][0]['mlp']['up_proj']
  ['weight']``; ``state_dict_name`` turns a leaf's pytree path back into the name). A parameter tied to another
  (``tie_word_embeddings``) is one leaf, under the name ``named_parameters()`` gives it.
* the module's other tensors (buffers, persistent or not, frozen parameters, tensor attributes such as
  ``rotary_emb.inv_freq``) are constants of the step, neither arguments nor trained.
* ``opt_state``: the optimizer's state for ``params`` (optax; default ``optax.adamw`` with torch.optim.AdamW's
  defaults, ``DEFAULT_LEARNING_RATE``...).
* ``inputs``: the tensors of ``example_inputs`` (a tuple of positional arguments of ``forward``, or a dict of
  keyword arguments), named after ``forward``'s parameters; other values in it (``None``, numbers, strings,
  ``use_cache=False``) are passed to ``forward`` as they are, in every step.
* ``loss``: a scalar, ``float32[]`` for a float32 model: the model output's ``.loss`` (a Hugging Face model given
  ``labels``), the output itself when ``forward`` returns a one-element tensor, else ``loss(output, *inputs)``
  (``loss(output, **inputs)`` for dict inputs), a function of torch tensors the user names.

The module runs in the mode it is in (``module.train()`` / ``.eval()``); buffers its forward updates in place
(BatchNorm's running statistics) are not carried out of the step.

torch, torchax and optax are imported inside the functions, never with ``toast``; ``require_torch`` is the one
place their absence, or a torchax that does not import with the installed torch, becomes an ``InputError``.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toast.errors import InputError

INSTALL = "pip install 'toast[torch]'"
# The top-level packages the extra installs (a factory that imports one fails with the install command).
EXTRA_PACKAGES = frozenset({"torch", "torchax", "optax"})
# torch.optim.AdamW's defaults (optax.adamw's weight decay is 1e-4; a PyTorch user expects torch's).
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_WEIGHT_DECAY = 1e-2
# Plain values an example input may hold besides tensors (passed to forward unchanged in every step).
_STATIC_TYPES = (type(None), bool, int, float, str)


def is_torch_module(obj: object) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module``, without importing torch (a module object means torch is loaded)."""
    torch = sys.modules.get("torch")
    nn = getattr(torch, "nn", None)
    return nn is not None and isinstance(obj, nn.Module)


def import_torch() -> Any:
    """``torch``, imported: what reading a module's parameters and inputs needs (tracing needs torchax too:
    ``require_torch``).

    Raises:
      InputError: torch is not installed; the message says what to install.
    """
    try:
        import torch
    except ImportError:
        raise InputError(f"a PyTorch model needs torch and torchax: {INSTALL}") from None
    return torch


def require_torch() -> tuple[Any, Any]:
    """``(torch, torchax)``, imported.

    Raises:
      InputError: either is not installed, or torchax does not import with this torch (torchax releases
        before 0.0.14.dev20260807 name operator overloads torch 2.13 removed); the message says what to install.
    """
    torch = import_torch()
    if "torchax" not in sys.modules and importlib.util.find_spec("torchax") is None:
        raise InputError(f"tracing a PyTorch model needs torchax: {INSTALL}")
    try:
        import torchax
    except ImportError as err:
        if sys.modules.get("torchax", False) is None:  # blocked on purpose (a test, a site policy)
            raise InputError(f"tracing a PyTorch model needs torchax: {INSTALL}") from None
        raise _incompatible(torch, err) from None
    except Exception as err:  # torchax's import-time registrations fail on a torch they predate
        raise _incompatible(torch, err) from None
    return torch, torchax


def _incompatible(torch: Any, err: BaseException) -> InputError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return InputError(f"torchax does not import with torch {torch.__version__} ({type(err).__name__}: {first}): "
                      f"{INSTALL} installs versions that work together")


def nest_state_dict(flat: Mapping[str, Any]) -> Any:
    """The nested pytree of ``flat``'s values by their dotted names: a dict per level, a list where a level's
    components are exactly ``0 .. n-1`` (``{"layers.0.w": a, "layers.1.w": b}`` -> ``{"layers": [{"w": a},
    {"w": b}]}``); other numeric components (``nn.Sequential``'s ``0`` and ``2`` around a ReLU) stay dict keys.

    Raises:
      ValueError: a name is empty, has an empty component, or is both a leaf and a prefix of another name.
    """
    root: dict[str, Any] = {}
    for name, value in flat.items():
        parts = name.split(".")
        if not all(parts):
            raise ValueError(f"{name!r}: not a dotted state_dict name")
        node = root
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"{name!r}: {'.'.join(parts[:depth + 1])} is a tensor, not a module")
            node = child
        if parts[-1] in node:
            raise ValueError(f"{name!r}: a module, or the same name twice")
        node[parts[-1]] = value
    return _lists(root)


def _lists(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    children = {key: _lists(value) for key, value in node.items()}
    indices = [str(k) for k in range(len(children))]
    if children and sorted(children) == sorted(indices):  # exactly "0" .. "n-1" (no "01", no gaps)
        return [children[key] for key in indices]
    return children


def state_dict_name(path: Sequence[Any]) -> str:
    """The dotted ``state_dict`` name of a leaf of ``nest_state_dict``'s pytree from its JAX key path
    (``jax.tree_util.tree_flatten_with_path``: ``DictKey`` and ``SequenceKey`` entries)."""
    parts = []
    for key in path:
        if hasattr(key, "key"):
            parts.append(str(key.key))
        elif hasattr(key, "idx"):
            parts.append(str(key.idx))
        else:
            raise ValueError(f"{key!r}: not a dict key or list index of a parameter pytree")
    return ".".join(parts)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepInputs:
    """How ``example_inputs`` become the step's input arguments and, in each step, ``forward``'s arguments.

    Attributes:
      names: the step's input argument names, one per tensor, in argument order (``forward``'s parameter names,
        ``input_K`` past them; ``params`` and ``opt_state`` are taken: ``input_params``).
      tensors: the example tensors (torch), in that order.
      args: ``forward``'s positional arguments: an ``int`` K is the step's K-th input tensor, a ``_Static`` a
        value passed as it is.
      kwargs: ``forward``'s keyword arguments, ``(name, slot)`` pairs as in ``args``.
    """

    names: tuple[str, ...]
    tensors: tuple[Any, ...]
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]

    def bind(self, values: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``forward``'s ``(args, kwargs)`` with ``values`` (one per tensor, in argument order) in the tensors'
        places."""
        def fill(slot: Any) -> Any:
            return slot.value if isinstance(slot, _Static) else values[slot]

        return tuple(fill(slot) for slot in self.args), {name: fill(slot) for name, slot in self.kwargs}


@dataclass(frozen=True, slots=True)
class _Static:
    value: Any


def step_inputs(module: Any, example_inputs: Any) -> StepInputs:
    """``StepInputs`` of ``example_inputs``: a tensor, a tuple (list) of ``forward``'s positional arguments or a
    dict of its keyword arguments; entries are tensors or plain values (``None``, bool, int, float, str).

    Raises:
      InputError: ``example_inputs`` is none of these, or an entry is another kind of object.
    """
    torch = import_torch()  # not torchax: Strategy.apply_torch names the inputs in processes that never trace
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(example_inputs, Mapping):
        items = [(str(name), value) for name, value in example_inputs.items()]
        keyword = True
    elif isinstance(example_inputs, (tuple, list)):
        positional = _positional_names(module)
        items = [(positional[k] if k < len(positional) else f"input_{k}", value)
                 for k, value in enumerate(example_inputs)]
        keyword = False
    else:
        raise InputError(f"example inputs should be a tuple of forward's arguments or a dict of its keyword "
                         f"arguments, not {type(example_inputs).__name__}")
    names: list[str] = []
    tensors: list[Any] = []
    slots: list[tuple[str, Any]] = []
    for name, value in items:
        if isinstance(value, torch.Tensor):
            slots.append((name, len(tensors)))
            tensors.append(value)
            names.append(_argument_name(name, taken=names))
        elif isinstance(value, _STATIC_TYPES):
            slots.append((name, _Static(value)))
        else:
            raise InputError(f"example input {name!r} is a {type(value).__name__}: give tensors, or None, bool, "
                             "int, float or str values")
    if keyword:
        return StepInputs(names=tuple(names), tensors=tuple(tensors), args=(), kwargs=tuple(slots))
    return StepInputs(names=tuple(names), tensors=tuple(tensors), args=tuple(slot for _, slot in slots), kwargs=())


def _positional_names(module: Any) -> list[str]:
    """``forward``'s positional parameter names (``self`` excluded), as far as they go."""
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    names = []
    for parameter in parameters:
        if parameter.kind not in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            break
        names.append(parameter.name)
    return names


def _argument_name(name: str, *, taken: Sequence[str]) -> str:
    """``name`` as a Python parameter name of the step, distinct from ``params``, ``opt_state`` and ``taken``."""
    found = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "input"
    if not found.isidentifier() or found in ("params", "opt_state"):
        found = f"input_{found}"
    base, k = found, 1
    while found in taken:
        found, k = f"{base}_{k}", k + 1
    return found


@dataclass(frozen=True, kw_only=True, slots=True)
class ModuleTensors:
    """A module's tensors, split into what the step trains and what it holds constant.

    Attributes:
      trained: ``(state_dict name, parameter)`` of each parameter with ``requires_grad``, in ``named_parameters``
        order (a tied parameter once).
      constants: ``(name, tensor)`` of every other tensor ``forward`` reads: buffers (persistent or not), frozen
        parameters, tensor attributes (``rotary_emb.inv_freq``).
    """

    trained: tuple[tuple[str, Any], ...]
    constants: tuple[tuple[str, Any], ...]


def module_tensors(module: Any) -> ModuleTensors:
    """``module``'s ``ModuleTensors``."""
    torch, _ = require_torch()
    trained = tuple((name, p) for name, p in module.named_parameters() if p.requires_grad)
    trained_ids = {id(p) for _, p in trained}
    constants: list[tuple[str, Any]] = []
    for prefix, sub in module.named_modules():
        dot = f"{prefix}." if prefix else ""
        found = [(name, t) for name, t in sub.named_parameters(recurse=False) if not t.requires_grad]
        found += list(sub.named_buffers(recurse=False))  # persistent or not
        found += [(name, t) for name, t in vars(sub).items() if isinstance(t, torch.Tensor)]
        constants += [(dot + name, tensor) for name, tensor in found if id(tensor) not in trained_ids]
    return ModuleTensors(trained=trained, constants=tuple(constants))


def jax_dtype(dtype: Any) -> Any:
    """The JAX dtype a torch tensor of ``dtype`` becomes (canonical: ``int64`` is ``int32`` without x64).

    Raises:
      InputError: a torch dtype JAX has no counterpart of (``torch.quint8``)."""
    import jax
    import jax.numpy as jnp

    name = str(dtype).removeprefix("torch.")
    try:
        return jax.dtypes.canonicalize_dtype(jnp.dtype(name))
    except TypeError:
        raise InputError(f"torch dtype {name} has no JAX counterpart") from None


def to_jax(tensor: Any) -> Any:
    """A torch tensor's value as a JAX array (a copy, in ``jax_dtype``)."""
    import jax.numpy as jnp
    import numpy as np

    dtype = jax_dtype(tensor.dtype)
    host = tensor.detach().cpu()
    if host.dtype.is_floating_point and host.dtype.itemsize < 4:  # bfloat16 and float16: through float32
        host = host.float()
    return jnp.asarray(np.asarray(host.numpy()), dtype=dtype)


def _abstract(tensor: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(tuple(tensor.shape), jax_dtype(tensor.dtype))


def default_optimizer() -> Any:
    """``optax.adamw`` with torch.optim.AdamW's defaults (learning rate 1e-3, betas 0.9 and 0.999, eps 1e-8,
    weight decay 1e-2)."""
    import optax

    return optax.adamw(DEFAULT_LEARNING_RATE, b1=0.9, b2=0.999, eps=1e-8, weight_decay=DEFAULT_WEIGHT_DECAY)


def _optimizer(optimizer: Any) -> Any:
    """``optimizer``, checked, or ``default_optimizer()``."""
    try:
        import optax  # noqa: F401 - the step applies the updates with it
    except ImportError:
        raise InputError(f"a PyTorch model's training step needs optax: {INSTALL}") from None
    if optimizer is None:
        return default_optimizer()
    if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        raise InputError(f"optimizer should be an optax GradientTransformation such as optax.adamw(1e-3), not "
                         f"{type(optimizer).__name__} (a torch.optim optimizer cannot be traced)")
    return optimizer


def training_step(module: Any, example_inputs: Any, *, loss: Callable[..., Any] | None = None,
                  optimizer: Any = None) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """One training step of ``module`` as a JAX function and its example arguments (the module docstring).

    Args:
      module: a ``torch.nn.Module``; its parameters give the shapes, its buffers the constants' values.
      example_inputs: ``forward``'s arguments, a tuple or a dict of keyword tensors (e.g. ``input_ids`` and
        ``labels``, ``int64[batch, seq]``); their shapes are the step's.
      loss: ``loss(output, *inputs)`` (``**inputs`` for a dict) of torch tensors, a scalar; default the output's
        ``.loss``.
      optimizer: an optax ``GradientTransformation``; default ``default_optimizer()``.

    Returns:
      ``(fn, example_args)``: ``fn(params, opt_state, *inputs) -> (params, opt_state, loss)`` and
      ``(params, opt_state, *inputs)`` as ``jax.ShapeDtypeStruct`` pytrees, for ``jax.jit(fn).lower``.

    Raises:
      InputError: torch or torchax missing (``require_torch``), unusable inputs, loss or optimizer; when ``fn`` is
        traced, an output without a loss or a loss that is not a scalar.
    """
    torch, torchax = require_torch()
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"expected a torch.nn.Module, not {type(module).__name__}")
    if loss is not None and not callable(loss):
        raise InputError(f"loss should be a function of (output, *inputs), not {type(loss).__name__}")
    chosen = _optimizer(optimizer)
    import jax
    import jax.numpy as jnp
    import optax

    inputs = step_inputs(module, example_inputs)
    tensors = module_tensors(module)
    if not tensors.trained:
        raise InputError(f"{type(module).__name__} has no parameter with requires_grad: nothing to train")
    copies: dict[int, Any] = {}  # one copy of a tensor under two names (HF's inv_freq and original_inv_freq)
    constants: dict[str, Any] = {}
    for name, tensor in tensors.constants:
        if id(tensor) not in copies:
            copies[id(tensor)] = to_jax(tensor)
        constants[name] = copies[id(tensor)]
    env = torchax.default_env()
    keyword = bool(inputs.kwargs)

    def loss_of(params: Any, values: Sequence[Any]) -> Any:
        flat = {state_dict_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
        args, kwargs = inputs.bind(values)
        state, args, kwargs = env.j2t_iso(({**flat, **constants}, args, kwargs))
        # torchax's device the default: a tensor forward makes with no device (torch.arange(n)) is traced too.
        with env, torch.device("jax"):
            output = torch.func.functional_call(module, state, args, kwargs, strict=False)
            if loss is None:
                value = model_loss(output)
            else:
                value = loss(output, **kwargs) if keyword else loss(output, *args)
            value = _scalar(value, torch)
        return jnp.reshape(env.t2j_iso(value), ())

    def step(params: Any, opt_state: Any, *values: Any) -> tuple[Any, Any, Any]:
        value, grads = jax.value_and_grad(loss_of)(params, values)
        updates, opt_state = chosen.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    # Named parameters, so the lowered program's arguments are params['model']['layers'][0]..., input_ids, labels.
    step.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
         for name in ("params", "opt_state", *inputs.names)])
    step.__name__ = step.__qualname__ = f"{type(module).__name__}_training_step"
    params = nest_state_dict({name: _abstract(p) for name, p in tensors.trained})
    opt_state = jax.eval_shape(chosen.init, params)
    return step, (params, opt_state, *(_abstract(t) for t in inputs.tensors))


def step_arguments(module: Any, example_inputs: Any, *, optimizer: Any = None) -> tuple[Any, ...]:
    """``training_step``'s arguments with values: ``(params, opt_state, *inputs)``, the module's current
    parameters, ``optimizer.init(params)`` and the example tensors, as JAX arrays (copies)."""
    require_torch()
    chosen = _optimizer(optimizer)
    params = nest_state_dict({name: to_jax(p) for name, p in module_tensors(module).trained})
    return (params, chosen.init(params), *(to_jax(t) for t in step_inputs(module, example_inputs).tensors))


def model_loss(output: Any) -> Any:
    """The loss in a model's ``output``: its ``.loss`` (or ``["loss"]``), or the output itself when it is a
    one-element tensor.

    Raises:
      InputError: neither (a Hugging Face model computes ``.loss`` only when given ``labels``).
    """
    value = getattr(output, "loss", None)
    if value is None and isinstance(output, Mapping):
        value = output.get("loss")
    if value is None and hasattr(output, "numel") and output.numel() == 1:
        value = output
    if value is None:
        raise InputError(f"the model's output ({type(output).__name__}) has no .loss: give the model labels "
                         "(a Hugging Face model computes its loss from labels=...), return the loss from forward, "
                         "or pass loss=fn(output, *inputs)")
    return value


def _scalar(value: Any, torch: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        raise InputError(f"the loss should be a scalar tensor, not {type(value).__name__}")
    if value.numel() != 1:
        raise InputError(f"the loss should be a scalar tensor, not one of shape {list(value.shape)} "
                         "(reduce it, e.g. .mean())")
    if not value.dtype.is_floating_point:
        raise InputError(f"the loss should be a float tensor, not {str(value.dtype).removeprefix('torch.')}")
    return value
