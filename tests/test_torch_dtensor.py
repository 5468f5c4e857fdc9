"""Shardings back as DTensor (``toast.output.torch_placements``, ``Strategy.apply_torch``): a strategy's
``PartitionSpec``s as one placement per mesh dim, worked out by hand, and one training step of the tiny Hugging
Face Llama sharded with DTensor on a gloo group of CPU processes, equal to eager PyTorch's unsharded step.

The argument-name parser and the spec-to-mesh-dim mapping need no torch; the rest skips without torch (and
transformers, optax, torchax for the strategy of the traced step)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import jax
import pytest

import toast
from toast.cli import main
from toast.errors import ToastError
from toast.output.torch_placements import INTERMEDIATES, Attribute, argument_path, mesh_dim_shards

LLAMA = "torch_models:tiny_llama?attn_implementation='eager'&use_cache=False"  # tests/dtensor_step.py's MODEL
VIT = "torch_models:tiny_vit"
PRELOAD = ("torch.distributed.tensor", "transformers.models.llama.modeling_llama",
           "transformers.models.vit.modeling_vit", "toast.output.autoshard",
           "torch_models", "dtensor_step")
SECONDS = 240  # the gloo step's bound: a few seconds alone, minutes on two busy cores


def test_argument_names_parse_back_to_the_pytree_paths_jax_names_them_by():
    tree = {"model": {"layers": [{"w": 0}, {"w": 1}], "it's": 2}, "head": {"0": 3}}
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "params" + jax.tree_util.keystr(path)  # how jax names a lowered function's argument
        keys = tuple(getattr(key, "key", getattr(key, "idx", None)) for key in path)
        assert argument_path(name) == ("params", keys)
    assert argument_path("params['model']['layers'][1]['self_attn']['q_proj']['weight']") == (
        "params", ("model", "layers", 1, "self_attn", "q_proj", "weight"))
    assert argument_path("opt_state[0].mu['lm_head']['weight']") == (
        "opt_state", (0, Attribute("mu"), "lm_head", "weight"))
    assert argument_path("labels") == ("labels", ())
    for bad in ("params[0:2]", "f(x)['w']", "params[True]", "params[", ""):
        with pytest.raises(ValueError, match="not an argument name of a lowered function"):
            argument_path(bad)


@pytest.mark.parametrize("spec, axes, shards", [
    (["batch", None], ("batch", "model"), (0, None)),    # rows over batch, whole over model
    ([None, "batch"], ("batch", "model"), (1, None)),
    (["model", "batch"], ("batch", "model"), (1, 0)),    # the mesh dim order, not the tensor's
    ([["batch", "model"], None], ("batch", "model"), (0, 0)),  # one dim over both: batch major, as DTensor
    ([], ("batch", "model"), (None, None)),              # a scalar: replicated
    ([None, None], ("data",), (None,)),                  # replicated
])
def test_a_partition_spec_gives_the_tensor_dim_each_mesh_dim_splits(spec, axes, shards):
    assert mesh_dim_shards(spec, axes) == shards


def test_a_dim_split_against_the_mesh_order_is_refused_in_one_line():
    with pytest.raises(ToastError) as raised:
        mesh_dim_shards([["model", "batch"]], ("batch", "model"), name="params['w']")
    message = str(raised.value)
    assert message.startswith("params['w']: dim 0 is split over model+batch (the major axis first), against the "
                              "mesh's axis order (batch, model): DTensor splits a dim")
    assert "\n" not in message
    with pytest.raises(ToastError, match="mesh axis 'expert' is not one of the mesh's"):
        mesh_dim_shards(["expert"], ("batch",))


def _document(spec_of_w):
    """A strategy document by hand: mesh batch=2,model=2, a pytree of parameters, Adam's state, two inputs."""
    def tensor(name, shape, spec):
        return {"name": name, "shape": shape, "dtype": "f32", "partition_spec": spec}

    return {"program": "jit_step", "mesh": {"axes": [["batch", 2], ["model", 2]]},
            "arguments": [tensor("params['a']['weight']", [8, 4], spec_of_w),
                          tensor("params['a']['layers'][0]['bias']", [4], [None]),
                          tensor("params['b']", [4, 8], [None, "model"]),
                          tensor("opt_state[0].count", [], []),
                          tensor("opt_state[0].mu['a']['weight']", [8, 4], ["batch", None]),  # not w's split
                          tensor("opt_state[0].mu['b']", [4, 8], [None, "model"]),
                          tensor("input_ids", [2, 16], ["batch", None]),
                          tensor("labels", [2, 16], [None, None])],
            "results": [tensor("result[0]['a']['weight']", [8, 4], spec_of_w),
                        tensor("result[0]['b']", [4, 8], ["model", None]),  # not the argument's split
                        tensor("result[2]", [], [])]}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def test_the_placements_of_a_strategy_worked_out_by_hand(torch):
    from torch.distributed.tensor import Replicate, Shard

    placements = toast.Strategy(_document([["batch", "model"], None])).torch_placements()
    assert placements.mesh == (("batch", 2), ("model", 2))
    assert placements.parameters == {"a.weight": (Shard(0), Shard(0)),  # dim 0 over batch then model
                                     "a.layers.0.bias": (Replicate(), Replicate()),
                                     "b": (Replicate(), Shard(1))}
    assert placements.inputs == {"input_ids": (Shard(0), Replicate()), "labels": (Replicate(), Replicate())}
    assert placements.shapes["a.weight"] == (8, 4) and placements.shapes["input_ids"] == (2, 16)
    assert placements.not_expressed == (
        INTERMEDIATES,
        "opt_state[0].mu['a']['weight'] (batch: dim 0, model: whole): torch.optim keeps it in its parameter "
        "a.weight's placements (batch: dim 0, model: dim 0)",
        "the updated b (batch: whole, model: dim 0): torch.optim updates it in place, in its placements "
        "(batch: whole, model: dim 1)")


def test_a_layout_dtensor_cannot_express_and_a_mesh_unlike_the_strategys_are_refused(torch):
    with pytest.raises(ToastError, match=r"^params\['a'\]\['weight'\]: dim 0 is split over model\+batch"):
        toast.Strategy(_document([["model", "batch"], None])).torch_placements()
    strategy = toast.Strategy(_document(["batch", None]))
    module = torch.nn.Linear(4, 8)  # weight [8, 4], bias [8]: no a.weight
    for mesh, expected in [(SimpleNamespace(shape=(4,), mesh_dim_names=None), "the device mesh is dim0=4, the "
                            "strategy's is batch=2,model=2: build it with init_device_mesh(device_type, (2, 2), "
                            "mesh_dim_names=('batch', 'model'))"),
                           (SimpleNamespace(shape=(2, 2), mesh_dim_names=("data", "model")),
                            "the device mesh is data=2,model=2, the strategy's is batch=2,model=2: "),
                           (SimpleNamespace(shape=(2, 2), mesh_dim_names=("batch", "model")),
                            "the strategy has parameter a.layers.0.bias, which the module has not (a strategy for "
                            "another module?)")]:
        with pytest.raises(ToastError) as raised:
            strategy.apply_torch(module, mesh)  # refused before any collective: no process group needed
        assert str(raised.value).startswith(expected) and "\n" not in str(raised.value)


def test_tied_parameters_stay_tied_and_the_inputs_come_back_as_given(torch, tmp_path):
    """On a one-process gloo group (in this process: nothing to split, the placements are still DTensor's)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)
            self.head = torch.nn.Linear(4, 8, bias=False)
            self.head.weight = self.embed.weight  # one Parameter, two names; named_parameters gives embed.weight

        def forward(self, ids, scale=1.0):
            return self.head(self.embed(ids)).sum() * scale

    def tensor(name, shape, spec):
        return {"name": name, "shape": shape, "dtype": "f32", "partition_spec": spec}

    strategy = toast.Strategy({"program": "jit_Tied_training_step", "mesh": {"axes": [["batch", 1]]},
                               "arguments": [tensor("params['embed']['weight']", [8, 4], ["batch", None]),
                                             tensor("ids", [2, 3], ["batch", None])], "results": []})
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("batch",))
        module, ids = Tied(), torch.zeros(2, 3, dtype=torch.long)
        given = strategy.apply_torch(module, mesh, {"ids": ids, "scale": 2.0})
        assert module.head.weight is module.embed.weight and isinstance(module.embed.weight, torch.nn.Parameter)
        assert isinstance(module.embed.weight.data, DTensor) and module.embed.weight.placements == (Shard(0),)
        assert set(given) == {"ids", "scale"} and given["scale"] == 2.0 and given["ids"].placements == (Shard(0),)
        (alone,) = strategy.apply_torch(Tied(), mesh, (ids,))
        assert isinstance(alone, DTensor) and isinstance(strategy.apply_torch(Tied(), mesh, ids), DTensor)
        assert strategy.apply_torch(Tied(), mesh) is None
        with pytest.raises(ToastError, match=r"^input ids is \[2, 4\], the strategy was made for \[2, 3\]$"):
            strategy.apply_torch(Tied(), mesh, torch.zeros(2, 4, dtype=torch.long))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def strategy_of(torch, tmp_path_factory):
    """``toast shard``'s strategy file for a tiny model's traced step (default the Llama), by mesh and expert
    strategy."""
    pytest.importorskip("transformers")
    pytest.importorskip("optax")
    pytest.importorskip("torchax")
    folder = tmp_path_factory.mktemp("strategies")
    _fork_server()

    def made(mesh: str, name: str, spec: str = LLAMA) -> str:
        model = spec.split(":")[1].split("?")[0]
        path = folder / f"{model}-{name}-{mesh.replace('=', '').replace(',', '-')}.json"
        assert main(["shard", spec, "--mesh", mesh, "--strategy", name, "--engine", "embedded", "-o",
                     str(path)]) == 0
        return str(path)

    return made


def _fork_server() -> None:
    """Start the fork server the gloo processes come from: it imports torch and transformers once for them all (a
    spawned process imports them itself, ~5 s of CPU each) and has run no threads (this process has: JAX's, torch's
    pools), so forking from it is safe. Started before the strategy's analysis, it imports meanwhile."""
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.set_forkserver_preload(list(PRELOAD))
    multiprocessing.forkserver.ensure_running()


def _sharded_step(torch, strategy_path: str, folder, factory: str = "tiny_llama") -> dict:
    """``dtensor_step.sharded_step`` on a gloo group of the strategy mesh's CPU processes, bounded by ``SECONDS``
    (then the processes are killed and the test fails); a worker's error fails the test with its traceback."""
    import torch.multiprocessing as mp
    from dtensor_step import sharded_step

    _fork_server()

    world = 1
    for _, size in toast.load_strategy(strategy_path).document["mesh"]["axes"]:
        world *= size
    out = folder / "rank0.pt"
    context = mp.start_processes(sharded_step, args=(world, str(folder / "store"), strategy_path, str(out), factory),
                                 nprocs=world, join=False, start_method="forkserver")
    deadline = time.monotonic() + SECONDS
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                pytest.fail(f"the {world} gloo processes did not finish the step in {SECONDS} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()
    return torch.load(out)


def _eager_step(torch, factory: str) -> tuple[float, dict, dict]:
    """Eager PyTorch's unsharded step: the loss, each parameter before, and after one SGD step."""
    from dtensor_step import LEARNING_RATE, model_and_inputs

    model, inputs = model_and_inputs(factory)
    loss = model(**inputs).loss
    loss.backward()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    return loss.item(), before, {name: (p - LEARNING_RATE * p.grad).detach() for name, p in model.named_parameters()}


def _check_equal(torch, sharded: dict, factory: str = "tiny_llama") -> None:
    loss, before, after = _eager_step(torch, factory)
    assert abs(sharded["loss"].item() - loss) <= 1e-5
    assert sorted(sharded["params"]) == sorted(after)
    for name, expected in after.items():
        assert not torch.equal(expected, before[name]), name  # the step moves every parameter
        torch.testing.assert_close(sharded["params"][name], expected, atol=1e-5, rtol=0, msg=name)


def test_the_fsdp_sharded_llama_step_on_two_gloo_processes_is_the_unsharded_step(torch, strategy_of, tmp_path):
    """FSDP on mesh batch=2: every parameter stored split over the two processes, the batch split."""
    from torch.distributed.tensor import Replicate, Shard

    path = strategy_of("batch=2", "fsdp")
    placements = toast.load_strategy(path).torch_placements()
    assert all(p != (Replicate(),) for p in placements.parameters.values())  # every parameter sharded
    assert placements.not_expressed == (INTERMEDIATES,)  # Adam's moments split as their parameters
    sharded = _sharded_step(torch, path, tmp_path)
    assert sharded["placements"] == placements.parameters  # the module was sharded as the strategy says
    assert sharded["placements"]["model.layers.0.mlp.down_proj.weight"] == (Shard(1),)  # [64, 128]: dim 1
    assert sharded["local_shapes"]["model.layers.0.mlp.down_proj.weight"] == (64, 64)
    # the labels' batch is the ids' (the coordinate gather of HF's loss, rules/ops/gather_scatter.dl): split alike
    assert sharded["inputs"] == {"input_ids": (Shard(0),), "labels": (Shard(0),)}
    _check_equal(torch, sharded)


@pytest.mark.slow
def test_the_fsdp_megatron_sharded_llama_step_on_four_gloo_processes_is_the_unsharded_step(torch, strategy_of,
                                                                                          tmp_path):
    """FSDP and Megatron on mesh batch=2,model=2 (a 2-D mesh: DTensor plans each op's redistributions over both
    dims, ~10 s of CPU per process)."""
    from torch.distributed.tensor import Shard

    path = strategy_of("batch=2,model=2", "fsdp+megatron")
    placements = toast.load_strategy(path).torch_placements()
    assert placements.parameters["model.layers.1.self_attn.q_proj.weight"] == (Shard(1), Shard(0))
    assert placements.not_expressed == (INTERMEDIATES,)
    sharded = _sharded_step(torch, path, tmp_path)
    assert sharded["placements"] == placements.parameters
    assert sharded["local_shapes"]["model.layers.1.self_attn.q_proj.weight"] == (32, 32)
    _check_equal(torch, sharded)


@pytest.mark.slow
def test_the_data_parallel_vit_step_on_two_gloo_processes_is_the_unsharded_step(torch, strategy_of, tmp_path):
    """Another family: the ViT's patch convolution, [CLS] token and classification loss, data parallel on batch=2
    (under FSDP, DTensor's convolution of a split batch by a split weight fails in torch 2.13: "shape '[2, 64, 16]'
    is invalid for input of size 1024")."""
    from torch.distributed.tensor import Replicate, Shard

    path = strategy_of("batch=2", "data_parallel", VIT)
    placements = toast.load_strategy(path).torch_placements()
    assert set(placements.parameters.values()) == {(Replicate(),)}
    sharded = _sharded_step(torch, path, tmp_path, "tiny_vit")
    assert sharded["placements"] == placements.parameters
    assert sharded["inputs"]["pixel_values"] == (Shard(0),)
    _check_equal(torch, sharded, "tiny_vit")
