"""A strategy for a PyTorch module's training step as DTensor placements (``torch.distributed.tensor``).

A strategy of a traced PyTorch step (``toast.frontend.torch_step``: arguments ``params['model']['layers'][0]...``,
``opt_state...``, then the inputs by ``forward``'s names) gives each argument a ``PartitionSpec`` over the mesh's
axes; DTensor gives a tensor one placement per mesh dim. ``torch_placements`` turns the one into the other, with
the mesh's axes as the ``DeviceMesh``'s dims in the same order:

* a mesh axis a ``PartitionSpec`` puts on tensor dim ``d`` is ``Shard(d)`` on that mesh dim, an axis it does not
  name ``Replicate()``: ``P('batch', 'model')`` on mesh ``batch=2,model=2`` is ``(Shard(0), Shard(1))``,
  ``P(None, 'batch')`` on ``batch=4,model=2`` is ``(Shard(1), Replicate())``;
* a dim split over several axes (``P(('batch', 'model'))``, the major axis first) is ``Shard(d)`` on each: DTensor
  splits a dim over mesh dims from the first to the last, so the chunk of device ``(b, m)`` is ``b * M + m`` in
  both. Where the spec's order is against the mesh's (``P(('model', 'batch'))`` on ``batch,model``) DTensor has no
  public placement for the layout (its private ``_StridedShard`` has): ``torch_placements`` refuses it.

What DTensor placements cannot say of a strategy (``TorchPlacements.not_expressed`` lists the cases found):

* intermediate values: DTensor propagates its own sharding op by op (each op's strategy, with the
  redistributions it needs), so the strategy's activation shardings and its collectives are not pinned;
* the optimizer state: ``torch.optim`` keeps a parameter's state (Adam's moments) in the parameter's placements;
  a strategy storing it otherwise (ZeRO-1: moments split, parameters replicated) is not expressed;
* the updated parameters: the optimizer updates them in place, in their placements, where a strategy may give
  the step's result another sharding;
* the module's other tensors (frozen parameters, buffers): constants of the traced step, so the strategy gives
  them none; they stay plain tensors, replicated (``implicit_replication``).

FSDP2 and tensor-parallel plans (not used here; what they would express):

* ``fully_shard(module, mesh=device_mesh[axis], shard_placement_fn=...)`` stores every parameter split on one
  dim over one data axis (``Shard(0)``, or the dim ``shard_placement_fn`` names: ``fsdp``'s ``Shard(1)`` of a
  ``down_proj``) and gathers it whole before its module runs (a schedule of its own, not DTensor's propagation).
  It expresses an ``fsdp`` strategy's parameters; not a parameter the strategy leaves whole on that axis, nor one
  split over several axes (``fsdp_all``), nor the placements of the inputs (FSDP2 takes local batches).
* ``parallelize_module`` with ``ColwiseParallel`` (an ``nn.Linear``'s weight ``Shard(0)``) and ``RowwiseParallel``
  (``Shard(1)``) over the model axis expresses ``megatron``'s parameters, plus activation layouts at each module's
  boundary, which a strategy file does not record per module; ``fsdp+megatron`` is both over a 2-D mesh.

``distribute_tensor`` with these placements lays out every parameter and input of any strategy DTensor can
express, which is why ``Strategy.apply_torch`` uses it.

A Hugging Face model under DTensor (torch 2.13, transformers 4.57, CPU): its forward makes plain tensors (the
rotary embedding's cos and sin, position ids, the causal mask), so the step runs under
``torch.distributed.tensor.experimental.implicit_replication()``; ``use_cache=False`` (the KV cache's ``torch.cat``
of a sharded DTensor onto an empty plain tensor fails); ``attn_implementation="eager"`` (with ``"sdpa"`` the tiny
Llama's step did not finish in 10 minutes on two gloo processes).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toast.errors import ToastError

PARAMS = "params"  # the traced step's argument names (toast.frontend.torch_step.training_step)
OPT_STATE = "opt_state"
INTERMEDIATES = ("intermediate values: DTensor propagates its own sharding op by op; the strategy's activation "
                 "shardings and collectives are not pinned")


@dataclass(frozen=True, slots=True)
class Attribute:
    """An attribute step of an argument name (``opt_state[0].mu``: ``Attribute("mu")``)."""

    name: str


def argument_path(name: str) -> tuple[str, tuple[str | int | Attribute, ...]]:
    """``(root, keys)`` of a lowered function's argument name, which JAX writes as the parameter's name and the
    leaf's ``jax.tree_util.keystr``: ``"params['model']['layers'][0]['w']"`` -> ``("params", ("model", "layers",
    0, "w"))``, ``"opt_state[0].mu['w']"`` -> ``("opt_state", (0, Attribute("mu"), "w"))``, ``"labels"`` ->
    ``("labels", ())``. Read as the Python expression it is (dict keys are ``repr``'d), so quotes in a key parse.

    Raises:
      ValueError: the name is not a name followed by subscripts of literals and attributes.
    """
    try:
        node = ast.parse(name, mode="eval").body
    except SyntaxError:
        raise ValueError(f"{name!r}: not an argument name of a lowered function") from None
    keys: list[str | int | Attribute] = []
    while not isinstance(node, ast.Name):
        if isinstance(node, ast.Subscript):
            try:
                key = ast.literal_eval(node.slice)
            except ValueError:
                key = None
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise ValueError(f"{name!r}: not an argument name of a lowered function")
            keys.append(key)
        elif isinstance(node, ast.Attribute):
            keys.append(Attribute(node.attr))
        else:
            raise ValueError(f"{name!r}: not an argument name of a lowered function")
        node = node.value
    return node.id, tuple(reversed(keys))


def mesh_dim_shards(partition_spec: Sequence[Any], axes: Sequence[str], *, name: str = "tensor"
                    ) -> tuple[int | None, ...]:
    """The tensor dim each mesh axis splits, ``None`` where it splits none (then the tensor is replicated over it),
    in the mesh's axis order: ``["batch", None]`` on axes ``(batch, model)`` -> ``(0, None)``; ``[["batch",
    "model"]]`` -> ``(0, 0)``.

    Args:
      partition_spec: a strategy file's entries, one per tensor dim: ``None``, an axis, or a list of axes (the
        major first).
      axes: the mesh's axis names, in order.
      name: the tensor's name, for the error.

    Raises:
      ToastError: an axis the mesh lacks, or a dim split over axes in an order against the mesh's (DTensor splits
        a dim over mesh dims from the first to the last).
    """
    split: dict[str, int] = {}
    for dim, entry in enumerate(partition_spec):
        entry_axes = [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
        unknown = [axis for axis in entry_axes if axis not in axes]
        if unknown:
            raise ToastError(f"{name}: mesh axis '{unknown[0]}' is not one of the mesh's ({', '.join(axes)})")
        order = [axes.index(axis) for axis in entry_axes]
        if order != sorted(order):
            raise ToastError(f"{name}: dim {dim} is split over {'+'.join(entry_axes)} (the major axis first), against "
                             f"the mesh's axis order ({', '.join(axes)}): DTensor splits a dim over mesh dims from "
                             "the first to the last and has no public placement for this layout")
        for axis in entry_axes:
            split[axis] = dim
    return tuple(split.get(axis) for axis in axes)


@dataclass(frozen=True, kw_only=True)
class TorchPlacements:
    """A strategy as DTensor placements: one per mesh dim, in the mesh's axis order, for each trained parameter and
    each input of the step.

    Attributes:
      mesh: ``(axis, size)`` per mesh dim: the ``DeviceMesh``'s ``mesh_dim_names`` and shape.
      parameters: ``state_dict`` name (``model.layers.0.mlp.up_proj.weight``) -> placements (``Shard(d)`` /
        ``Replicate()`` of ``torch.distributed.tensor``).
      inputs: input name (``forward``'s, as the step names its inputs: ``input_ids``) -> placements.
      shapes: the shape the strategy was made for, by parameter and input name.
      not_expressed: what of the strategy the placements do not carry, one line each (the module docstring).
    """

    mesh: tuple[tuple[str, int], ...]
    parameters: dict[str, tuple[Any, ...]]
    inputs: dict[str, tuple[Any, ...]]
    shapes: dict[str, tuple[int, ...]]
    not_expressed: tuple[str, ...]


def _spec_text(shards: Sequence[int | None], axes: Sequence[str]) -> str:
    return ", ".join(f"{axis}: dim {dim}" if dim is not None else f"{axis}: whole"
                     for axis, dim in zip(axes, shards, strict=True))


def torch_placements(strategy: Any) -> TorchPlacements:
    """The DTensor placements of a strategy of a traced PyTorch step (the module docstring).

    Args:
      strategy: a ``toast.Strategy``, or a strategy document (a strategy file's JSON).

    Raises:
      ToastError: a document that is not a strategy, one with no ``params[...]`` argument (not a PyTorch step's),
        or a layout DTensor cannot express (``mesh_dim_shards``).
    """
    from torch.distributed.tensor import Replicate, Shard

    from toast.output.strategy_file import read_strategy_document

    document = strategy if isinstance(strategy, Mapping) else getattr(strategy, "document", None)
    if not isinstance(document, Mapping):
        raise ToastError(f"not a strategy: {type(strategy).__name__} (give a toast.Strategy or a strategy document)")
    if strategy is document:
        document = read_strategy_document(dict(document))
    mesh = tuple((str(axis), int(size)) for axis, size in document["mesh"]["axes"])
    axes = [axis for axis, _ in mesh]

    def placements(shards: Sequence[int | None]) -> tuple[Any, ...]:
        return tuple(Replicate() if dim is None else Shard(dim) for dim in shards)

    params: dict[tuple[Any, ...], tuple[str, tuple[int | None, ...], tuple[int, ...]]] = {}  # keys -> name, ...
    inputs: dict[str, tuple[int | None, ...]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    states: list[tuple[str, tuple[Any, ...], tuple[int | None, ...], tuple[int, ...]]] = []
    for tensor in document["arguments"]:
        name, shape = str(tensor["name"]), tuple(int(n) for n in tensor["shape"])
        try:
            root, keys = argument_path(name)
        except ValueError as err:
            raise ToastError(f"strategy argument {err}") from None
        shards = mesh_dim_shards(tensor["partition_spec"], axes, name=name)
        if root == PARAMS and keys and not any(isinstance(key, Attribute) for key in keys):
            state_name = ".".join(str(key) for key in keys)
            params[keys] = (state_name, shards, shape)
            shapes[state_name] = shape
        elif root == OPT_STATE:
            states.append((name, keys, shards, shape))
        else:
            inputs[name] = shards
            shapes[name] = shape
    if not params:
        raise ToastError(f"the strategy for {document['program']} has no params[...] argument: not a PyTorch "
                         "module's training step (toast.frontend.torch_step)")
    notes = [INTERMEDIATES]
    for name, keys, shards, shape in states:
        owner = next((params[keys[k:]] for k in range(len(keys)) if keys[k:] in params), None)
        if owner is not None and owner[2] == shape:
            if owner[1] != shards:
                notes.append(f"{name} ({_spec_text(shards, axes)}): torch.optim keeps it in its parameter "
                             f"{owner[0]}'s placements ({_spec_text(owner[1], axes)})")
        elif any(dim is not None for dim in shards):
            notes.append(f"{name} ({_spec_text(shards, axes)}): torch.optim's state has no tensor of it")
    for tensor in document["results"]:  # result[0]: the updated params (training_step returns params first)
        try:
            root, keys = argument_path(str(tensor["name"]))
        except ValueError:
            continue
        if root != "result" or not keys or keys[0] != 0 or keys[1:] not in params:
            continue
        state_name, shards, _ = params[keys[1:]]
        updated = mesh_dim_shards(tensor["partition_spec"], axes, name=str(tensor["name"]))
        if updated != shards:
            notes.append(f"the updated {state_name} ({_spec_text(updated, axes)}): torch.optim updates it in place, "
                         f"in its placements ({_spec_text(shards, axes)})")
    return TorchPlacements(mesh=mesh,
                           parameters={name: placements(shards) for name, shards, _ in params.values()},
                           inputs={name: placements(shards) for name, shards in inputs.items()},
                           shapes=shapes, not_expressed=tuple(notes))


def check_device_mesh(placements: TorchPlacements, device_mesh: Any) -> None:
    """Refuse a ``DeviceMesh`` of another shape than the strategy's mesh, or with other dim names.

    Raises:
      ToastError: one line naming both meshes and how to build the strategy's.
    """
    sizes = tuple(size for _, size in placements.mesh)
    names = tuple(axis for axis, _ in placements.mesh)
    shape = tuple(int(n) for n in device_mesh.shape)
    given = device_mesh.mesh_dim_names
    if shape != sizes or (given is not None and tuple(given) != names):
        label = ",".join(f"{axis}={size}" for axis, size in placements.mesh)
        got = ",".join(f"{axis}={size}" for axis, size in zip(given or [f"dim{k}" for k in range(len(shape))],
                                                              shape, strict=True))
        raise ToastError(f"the device mesh is {got}, the strategy's is {label}: build it with "
                         f"init_device_mesh(device_type, {sizes}, mesh_dim_names={names})")


def distribute(placements: TorchPlacements, module: Any, device_mesh: Any, inputs: Any = None) -> Any:
    """Put ``module``'s trained parameters on ``device_mesh`` in ``placements`` (in place: each becomes an
    ``nn.Parameter`` of a ``DTensor``, under every name it has, so tied parameters stay tied) and return
    ``inputs`` distributed likewise (``Strategy.apply_torch``).

    Every rank calls it with the same module and inputs: ``distribute_tensor`` splits rank 0's values.

    Raises:
      ToastError: a mesh unlike the strategy's, parameters or inputs it does not name or of other shapes.
    """
    import torch
    from torch.distributed.tensor import distribute_tensor

    from toast.frontend.torch_step import step_inputs

    check_device_mesh(placements, device_mesh)
    trained = {name: p for name, p in module.named_parameters() if p.requires_grad}
    missing = sorted(set(placements.parameters) - set(trained))
    extra = sorted(set(trained) - set(placements.parameters))
    if missing or extra:
        what = (f"the strategy has parameter {missing[0]}, which the module has not" if missing
                else f"the module's parameter {extra[0]} is not in the strategy")
        raise ToastError(f"{what} (a strategy for another module?)")
    for name, p in trained.items():
        if tuple(p.shape) != placements.shapes[name]:
            raise ToastError(f"parameter {name} is {list(p.shape)}, the strategy's is {list(placements.shapes[name])}")
    bound = step_inputs(module, inputs) if inputs is not None else None
    if bound is not None:
        for name, tensor in zip(bound.names, bound.tensors, strict=True):
            if name not in placements.inputs:
                raise ToastError(f"input {name} is not in the strategy (its inputs: {', '.join(placements.inputs)})")
            if tuple(tensor.shape) != placements.shapes[name]:
                raise ToastError(f"input {name} is {list(tensor.shape)}, the strategy was made for "
                                 f"{list(placements.shapes[name])}")
    moved: dict[int, Any] = {}
    for name, p in trained.items():
        local = distribute_tensor(p.detach(), device_mesh, list(placements.parameters[name]))
        moved[id(p)] = torch.nn.Parameter(local, requires_grad=True)
    for owner in module.modules():  # every name of each parameter: a tied one is one Parameter in two modules
        for leaf, p in list(owner.named_parameters(recurse=False, remove_duplicate=False)):
            if id(p) in moved:
                owner.register_parameter(leaf, moved[id(p)])
    if bound is None:
        return None
    values = [distribute_tensor(tensor, device_mesh, list(placements.inputs[name]))
              for name, tensor in zip(bound.names, bound.tensors, strict=True)]
    args, kwargs = bound.bind(values)
    if isinstance(inputs, Mapping):
        return kwargs
    return args[0] if isinstance(inputs, torch.Tensor) else args

