"""One training step of a tiny Hugging Face model (``tests/torch_models.py``) sharded with DTensor, run in each
process of a gloo group (``tests/test_torch_dtensor.py`` spawns it; a module of its own so the spawned processes
import torch, transformers and toast's output stage, not the test module). Imports happen inside the functions."""

from __future__ import annotations

from typing import Any

LEARNING_RATE = 0.5
MODEL = {"attn_implementation": "eager", "use_cache": False}  # what DTensor runs (tests/test_torch_dtensor.py)
# Each factory's keywords for DTensor (tiny_vit's attention is eager already, and it has no cache).
KEYWORDS = {"tiny_llama": MODEL, "tiny_vit": {}}


def model_and_inputs(factory: str) -> tuple[Any, Any]:
    """``tests/torch_models.py``'s ``factory`` with its ``KEYWORDS``."""
    import torch_models

    return getattr(torch_models, factory)(**KEYWORDS[factory])


def sharded_step(rank: int, world: int, store: str, strategy_path: str, out: str, factory: str = "tiny_llama",
                 ) -> None:
    """Rank ``rank`` of ``world``: join the gloo group over the file store ``store``, build the seeded model (the
    ``factory`` of ``tests/torch_models.py``) and its
    inputs, shard them with the strategy file's ``Strategy.apply_torch``, run forward (the model's loss), backward
    and one ``torch.optim.SGD`` step, gather every parameter back (``full_tensor``); rank 0 saves ``{"loss",
    "params", "placements", "local_shapes"}`` to ``out`` (``torch.save``)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import implicit_replication

    import toast

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        strategy = toast.load_strategy(strategy_path)
        axes = strategy.document["mesh"]["axes"]
        mesh = init_device_mesh("cpu", tuple(size for _, size in axes), mesh_dim_names=tuple(a for a, _ in axes))
        model, inputs = model_and_inputs(factory)
        inputs = strategy.apply_torch(model, mesh, inputs)
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        # HF's forward makes tensors of its own (position ids, the causal mask): they are replicated.
        with implicit_replication():
            loss = model(**inputs).loss
            loss.backward()
        optimizer.step()
        result: dict[str, Any] = {
            "loss": loss.full_tensor().detach(),
            "params": {name: p.full_tensor().detach() for name, p in model.named_parameters()},
            "placements": {name: tuple(p.placements) for name, p in model.named_parameters()},
            "local_shapes": {name: tuple(p.to_local().shape) for name, p in model.named_parameters()},
            "inputs": {name: tuple(t.placements) for name, t in inputs.items() if hasattr(t, "placements")},
        }
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()
