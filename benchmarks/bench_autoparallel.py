"""toast and PyTorch's AutoParallel planning the same PyTorch model on the same mesh (issue 39).

    python benchmarks/bench_autoparallel.py [--hidden 512 --intermediate 1408 --layers 8 --heads 8 --kv-heads 2
                                            --vocab 32000 --batch 8 --seq 512] [--mesh batch=4,model=2]
                                           [--hardware h100] [--rollouts 2000] [--skip-autoparallel]
                                           [--autoparallel-result FILE] [--out FILE]

The model: a random Hugging Face ``LlamaForCausalLM`` (float32, HF's eager attention: AutoParallel has no DTensor
strategy for CPU's fused attention op, and the same attention is used on both sides), its loss from ``labels``.
The mesh's first axis is the data axis; both planners get the token inputs split on it (AutoParallel:
``add_input_constraints`` ``(Shard(0), Replicate())``; toast: ``pinned`` ``(first axis, None)``), and
AutoParallel its default parameter memory constraint (``add_parameter_memory_constraint()``: at most 1/devices of
the parameters per device).

* toast: ``toast.frontend.torch_step.training_step`` (torchax: the forward, HF's loss, the backward and an AdamW
  step) and ``toast.autoshard`` on the mesh and hardware profile (MCTS, ``--rollouts``, seed 0).
* AutoParallel (https://github.com/meta-pytorch/autoparallel, installed from source: the ``autoparallel`` on PyPI
  is an unrelated package): ``AutoParallel(model, input_fn, mesh)`` on a fake process group's ``cpu`` mesh of the
  same shape, ``optimize_placement()`` (its ILP, solved by PuLP's CBC). AutoParallel reads the GPU's name for its
  compute estimates; on a machine without one its own H100 entry (``DEVICE_LIMITS``) is used, matching toast's
  ``h100``; its collective model falls back to its default (no NCCL topology without a GPU).

Each planner runs in a child process; the parent reads the child's wall seconds and its CPU seconds (user + system
of it and of its own children: Soufflé, the search's workers, CBC) from ``resource.getrusage(RUSAGE_CHILDREN)``.
toast's seconds include tracing through torchax, JAX's lowering, the analysis and the search; AutoParallel's,
tracing (dynamo + AOT autograd), building and solving the ILP.

AutoParallel's plan is then translated into toast's terms, from its chosen placement of each parameter and input
(``Shard(d)`` on mesh dim ``m``: tensor dim ``d`` split over mesh axis ``m``) and the placements the parameter's
users take it in. A split every user keeps is a computed split: a pin in toast's action space (the argument's
color sharded, toast's own propagation; AdamW's ``mu`` and ``nu`` as their parameter, as DTensor's optimizer state
is). A split some user gathers (FSDP) is a stored split: the argument and its update chain split, as toast's own
stored actions and FSDP strategies do. A computed split whose color action would break an earlier pin (toast's
color joins dims AutoParallel splits differently and redistributes between) is stored split instead, and the
JSON lists each one. Both states are priced by one ``CostModel`` of toast's program. What the translation loses:
AutoParallel also chooses every intermediate's placement and the redistributions between them; toast prices the
argument placements with its own propagation and its own collectives. So the AutoParallel row is toast's price of
AutoParallel's argument placements, not of AutoParallel's whole program.

Writes a JSON (``--out``, default ``benchmarks/data/autoparallel_<size>.json``) with the settings, versions, the
machine, the date, both planners' seconds and both plans' predicted step time and peak, and prints a table.
Without AutoParallel installed, says so in one line and stops (status 0).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("torch", "autoparallel", "torchax", "jax", "jaxlib", "transformers", "pulp", "toast")
# A leaf's state_dict path inside a toast argument name: "params['model']['layers'][1]['mlp']['up_proj']['weight']"
# or "opt_state[0].mu['model']...": the bracketed keys after "params", ".mu" or ".nu".
_TREE = re.compile(r"^(?:params|.*\.mu|.*\.nu)((?:\[(?:'[^']*'|\d+)\])+)$")
_KEY = re.compile(r"\['([^']*)'\]|\[(\d+)\]")


# --- The translation (pure; tested in tests/test_bench_autoparallel.py) ---------------------------------------------

def partition_spec(placements: Sequence[str], mesh_axes: Sequence[str], rank: int) -> tuple[Any, ...]:
    """A DTensor placement tuple as ``PartitionSpec`` entries.

    Args:
      placements: one per mesh dim, in mesh order: ``"S(d)"`` (``Shard(d)``), ``"R"`` (``Replicate()``) or
        ``"P"`` (``Partial``: a parameter or input is never partial; read as replicated).
      mesh_axes: the mesh's axis names, in mesh order (``len(placements)`` of them).
      rank: the tensor's rank.

    Returns:
      ``rank`` entries: ``None``, an axis name, or a tuple of axis names in mesh order (DTensor splits a dim over
      several mesh dims major to minor in mesh order, as a ``PartitionSpec`` tuple does).

    Raises:
      ValueError: a placement count other than the mesh's, an unknown placement, or a dim past ``rank``.
    """
    if len(placements) != len(mesh_axes):
        raise ValueError(f"{len(placements)} placements for a mesh of {len(mesh_axes)} axes")
    axes_of: list[list[str]] = [[] for _ in range(rank)]
    for placement, axis in zip(placements, mesh_axes, strict=True):
        if placement in ("R", "P"):
            continue
        match = re.fullmatch(r"S\((-?\d+)\)", placement)
        if match is None:
            raise ValueError(f"placement {placement!r}: expected 'S(d)', 'R' or 'P'")
        dim = int(match.group(1))
        dim = dim + rank if dim < 0 else dim
        if not 0 <= dim < rank:
            raise ValueError(f"placement {placement!r} for a tensor of rank {rank}")
        axes_of[dim].append(axis)
    return tuple(None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in axes_of)


def state_dict_name(argument: str) -> str | None:
    """The ``state_dict`` name a toast argument holds (a parameter, or AdamW's ``mu`` / ``nu`` of one), or
    ``None`` (an input, the optimizer's step count): ``"opt_state[0].mu['model']['layers'][1]['mlp']['up_proj']
    ['weight']"`` -> ``"model.layers.1.mlp.up_proj.weight"``."""
    match = _TREE.match(argument)
    if match is None:
        return None
    return ".".join(key or index for key, index in _KEY.findall(match.group(1)))


def split_kinds(stored: Sequence[str], used: Sequence[Sequence[str]] | None) -> tuple[list[str], list[str]]:
    """A parameter's stored placements split into those it is computed with and those it is only stored with.

    Args:
      stored: the parameter's placements (one per mesh dim) as AutoParallel stores it.
      used: the placements its users take it in (after the redistributions AutoParallel put before them), or
        ``None`` where unknown.

    Returns:
      ``(computed, stored_only)``, one placement per mesh dim each: a mesh dim whose ``Shard(d)`` every user keeps
      is computed split (tensor parallelism: ``computed`` has it, ``stored_only`` ``"R"``); one some user gathers
      is stored split only (FSDP: all-gathered before use, its gradient reduce-scattered; ``stored_only`` has it,
      ``computed`` ``"R"``). Unknown users: every split counts as computed.
    """
    computed, stored_only = [], []
    for mesh_dim, placement in enumerate(stored):
        kept = used is None or (bool(used) and all(use[mesh_dim] == placement for use in used))
        if placement.startswith("S(") and not kept:
            computed.append("R")
            stored_only.append(placement)
        else:
            computed.append(placement)
            stored_only.append("R")
    return computed, stored_only


def translate(arguments: Sequence[tuple[str, int]], parameters: Mapping[str, Sequence[str]],
              inputs: Mapping[str, Sequence[str]], mesh_axes: Sequence[str],
              used: Mapping[str, Sequence[Sequence[str]]] | None = None,
              ) -> tuple[dict[str, tuple], dict[str, tuple], list[str]]:
    """AutoParallel's placements as toast pins and stored splits.

    Args:
      arguments: toast's program arguments as ``(name, rank)``.
      parameters: ``state_dict`` name -> placements (``partition_spec``'s strings) of each parameter as stored.
      inputs: input name (``input_ids``, ``labels``) -> placements.
      mesh_axes: the mesh's axis names.
      used: ``state_dict`` name -> the placements its users take it in (``split_kinds``); ``None``: unknown.

    Returns:
      ``(pins, stored, unplaced)``: ``argument name -> PartitionSpec entries`` it is computed with (every
      argument AutoParallel placed, replicated ones included; AdamW's ``mu`` and ``nu`` as their parameter), the
      ``PartitionSpec`` entries of the splits it is only stored with (FSDP; only arguments that have one), and the
      arguments AutoParallel did not place (the optimizer's step count), left to toast's propagation.
    """
    pins: dict[str, tuple] = {}
    stored: dict[str, tuple] = {}
    unplaced = []
    for name, rank in arguments:
        key = state_dict_name(name)
        if key is None and name in inputs:
            pins[name] = partition_spec(inputs[name], mesh_axes, rank)
            continue
        if key is None or key not in parameters:
            unplaced.append(name)
            continue
        computed, stored_only = split_kinds(parameters[key], None if used is None else used.get(key))
        pins[name] = partition_spec(computed, mesh_axes, rank)
        spec = partition_spec(stored_only, mesh_axes, rank)
        if any(entry is not None for entry in spec):
            stored[name] = spec
    return pins, stored, unplaced


# --- The model --------------------------------------------------------------------------------------------------

def llama(settings: Mapping[str, int], *, meta: bool = False) -> tuple[Any, dict[str, Any]]:
    """A random ``LlamaForCausalLM`` of ``settings`` (hidden, intermediate, layers, heads, kv_heads, vocab; seed 0;
    eager attention) and ``{"input_ids": int64[batch, seq], "labels": the same}``. ``meta``: parameters on the meta
    device (AutoParallel plans without allocating them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=settings["hidden"], intermediate_size=settings["intermediate"],
                         num_hidden_layers=settings["layers"], num_attention_heads=settings["heads"],
                         num_key_value_heads=settings["kv_heads"], vocab_size=settings["vocab"],
                         max_position_embeddings=max(settings["seq"], 128), use_cache=False,
                         attn_implementation="eager")
    if meta:
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
    else:
        model = LlamaForCausalLM(config)
    ids = torch.randint(0, settings["vocab"], (settings["batch"], settings["seq"]),
                        generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "labels": ids}


def mesh_axes(mesh: str) -> list[tuple[str, int]]:
    """``"batch=4,model=2"`` -> ``[("batch", 4), ("model", 2)]``."""
    axes = []
    for part in mesh.split(","):
        name, _, size = part.partition("=")
        axes.append((name.strip(), int(size)))
    return axes


# --- The children -------------------------------------------------------------------------------------------------

def plan_toast(settings: Mapping[str, Any], result: Path) -> None:
    """Child: trace, analyze and search; write the strategy document and the analysis's size to ``result``."""
    import toast
    from toast.frontend.torch_step import training_step

    model, inputs = llama(settings)
    fn, args = training_step(model, inputs)
    data_axis = mesh_axes(settings["mesh"])[0][0]
    strategy = toast.autoshard(fn, *args, mesh=settings["mesh"], hardware=settings["hardware"], seed=0,
                               rollouts=settings["rollouts"],
                               pinned={"input_ids": (data_axis, None), "labels": (data_axis, None)})
    result.write_text(json.dumps({"strategy": strategy.document}))


def plan_autoparallel(settings: Mapping[str, Any], result: Path) -> None:
    """Child: AutoParallel's plan on a fake mesh; write each parameter's and input's placements, the ILP's size
    and AutoParallel's own estimate to ``result``."""
    import autoparallel.cost_models.compute_estimation as compute_estimation
    import torch
    from autoparallel.api import AutoParallel
    from torch._functorch._aot_autograd.fx_utils import get_named_param_nodes, get_plain_input_and_grad_nodes
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not torch.cuda.is_available():  # its compute estimates read the GPU's name: use its own H100 entry
        h100 = next(limit for limit in compute_estimation.DEVICE_LIMITS if limit.name == "H100")
        compute_estimation._get_device_limit = lambda: h100
    axes = mesh_axes(settings["mesh"])
    shape = tuple(size for _, size in axes)
    world = 1
    for size in shape:
        world *= size
    torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", shape, mesh_dim_names=tuple(n for n, _ in axes))

    class WithLoss(torch.nn.Module):
        """The model called as toast's step calls it: keyword inputs, HF's loss out."""

        def __init__(self, lm: torch.nn.Module):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return self.lm(input_ids=input_ids, labels=labels, use_cache=False).loss

    lm, _ = llama(settings, meta=True)
    model = WithLoss(lm)

    def input_fn() -> tuple[Any, Any]:
        ids = torch.randint(0, settings["vocab"], (settings["batch"], settings["seq"]))
        return ids, ids.clone()

    def text(placement: Any) -> str:
        if isinstance(placement, Shard):
            return f"S({placement.dim})"
        if isinstance(placement, Replicate):
            return "R"
        if isinstance(placement, Partial):
            return "P"
        raise ValueError(f"placement {placement!r}")

    data = (Shard(0),) + (Replicate(),) * (len(shape) - 1)
    with AutoParallel(model, input_fn, mesh) as autop:
        autop.add_input_constraints([data, data])
        autop.add_parameter_memory_constraint(low=None, high=None)
        solution = autop.optimize_placement()
        optimizer = autop.sharding_optimizer
        graph = autop.gm.graph
        parameters = {fqn.removeprefix("lm."): [text(p) for p in solution[node].output_specs.placements]
                      for fqn, node in get_named_param_nodes(graph).items()}
        try:
            used = {}  # each parameter's placements where its users take it (after the redistribution before them)
            for fqn, node in get_named_param_nodes(graph).items():
                takes = set()
                for user in node.users:
                    spec = solution.get(user)
                    tensors = [a for a in user.all_input_nodes]
                    if spec is None or node not in tensors or not spec.input_specs:
                        continue
                    index = tensors.index(node)
                    if index < len(spec.input_specs) and spec.input_specs[index] is not None:
                        takes.add(tuple(text(p) for p in spec.input_specs[index].placements))
                used[fqn.removeprefix("lm.")] = sorted(list(t) for t in takes)
        except Exception as err:  # the plan is still worth writing; the translation then says it lacks them
            print(f"bench_autoparallel: the users' placements not read: {err!r}", file=sys.stderr)
            used = None
        inputs = {}
        for name, (_descriptor, nodes) in zip(("input_ids", "labels"),
                                             get_plain_input_and_grad_nodes(graph).items(), strict=True):
            node = nodes[0] if isinstance(nodes, tuple) else nodes
            inputs[name] = [text(p) for p in solution[node].output_specs.placements]
        ilp = {"variables": len(optimizer.prob.variables()), "constraints": len(optimizer.prob.constraints),
               "objective": float(optimizer.prob.objective.value()), "status": int(optimizer.prob.status)}
    result.write_text(json.dumps({"parameters": parameters, "used": used, "inputs": inputs, "ilp": ilp}))


def run_child(planner: str, settings: Mapping[str, Any]) -> tuple[dict[str, Any], float, float]:
    """Run one planner in a child process: its result, wall seconds and CPU seconds (it and its children)."""
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        command = [sys.executable, __file__, "--child", planner, "--child-result", str(result),
                   "--child-settings", json.dumps(dict(settings))]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"{planner} planning failed (status {done.returncode})")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return json.loads(result.read_text()), wall, cpu


# --- Pricing --------------------------------------------------------------------------------------------------

def price(settings: Mapping[str, Any], toast_document: dict[str, Any], placements: Mapping[str, Any]
          ) -> dict[str, Any]:
    """Both plans priced by one ``CostModel`` of toast's program: toast's state (read back from its strategy
    document) and the state AutoParallel's argument placements pin."""
    import numpy as np

    import toast
    from toast.frontend.torch_step import training_step
    from toast.sharding.state import ShardNodes
    from toast.sharding.strategies import apply_any, parameter_nodes

    model, inputs = llama(settings)
    fn, args = training_step(model, inputs)
    analysis = toast.analyze("step", fn=fn, args=list(args))
    sharding = toast.ShardingModel(analysis, toast.parse_mesh(settings["mesh"]))
    costs = toast.CostModel(sharding, toast.load_hardware(settings["hardware"]))
    program = analysis.program
    arguments = [(program.values[v].name, len(program.values[v].shape)) for v in program.arguments]
    axis_names = [name for name, _ in mesh_axes(settings["mesh"])]
    pins, stored, unplaced = translate(arguments, placements["parameters"], placements["inputs"], axis_names,
                                       placements.get("used"))
    theirs, demoted = pinned_state(sharding, pins)
    by_name = {program.values[v].name: v for v in program.arguments}
    splits = [(name, dim, axis) for name, spec in sorted(stored.items()) for dim, entry in enumerate(spec)
              for axis in (() if entry is None else (entry,) if isinstance(entry, str) else entry)]
    dropped = []
    for name, dim, axis in splits + demoted:  # FSDP's splits: the argument and its update chain, as toast stores
        nodes = parameter_nodes(analysis, by_name[name], dim)
        try:
            theirs = apply_any(sharding, theirs, ShardNodes(nodes, axis, f"{name}:{dim} stored split"))
        except toast.InvalidState:
            dropped.append((name, dim, axis))
    ours = toast.strategy_state(sharding, toast_document, path="toast plan")
    rows = {}
    for label, state in (("toast", ours), ("AutoParallel", theirs)):
        cost = costs.evaluate(state)
        sharded = int(np.count_nonzero(state.masks))
        rows[label] = {"step_time_s": cost.step_time_s, "peak_bytes": int(cost.peak_bytes),
                       "exposed_communication_s": cost.breakdown.get("exposed_communication_s", 0.0),
                       "collectives": len(cost.collectives), "sharded_dimension_names": sharded}
    return {"plans": rows, "arguments": len(arguments), "pinned": len(pins), "stored_split": len(stored),
            "demoted_to_stored": [list(d) for d in demoted], "dropped": [list(d) for d in dropped],
            "unplaced": unplaced, "stored_by_spec": count_specs(stored.values()),
            "pins_by_spec": count_specs(pins.values()), "dimension_names": int(analysis.names.count),
            "ops": len(program.ops) if hasattr(program, "ops") else None}


def pinned_state(sharding: Any, pins: Mapping[str, tuple]) -> tuple[Any, list[tuple[str, int, str]]]:
    """The state the pins make with toast's propagation (each split a color action, as ``toast autoshard --pin``
    makes its starting state), and the splits no color action can make without breaking an earlier pin
    (toast's color joins dims AutoParallel split differently, redistributing between them) or the state.

    Pins are taken largest argument first, each split in mesh order; a split whose color action would give an
    already pinned dim a mesh axis its pin has not, or an invalid state, is left out and returned as
    ``(argument, dim, axis)``: ``price`` stores it split instead (gathered where used, as FSDP).
    """
    import itertools

    import numpy as np

    import toast
    from toast.search.actions import MAX_ENUMERATED_BITS

    analysis, mesh = sharding.analysis, sharding.mesh
    program, names = analysis.program, analysis.names
    by_name = {program.values[v].name: v for v in program.arguments}
    wanted: dict[int, int] = {}  # dimension name -> its pin's mask
    for argument, spec in pins.items():
        base = names.def_base[by_name[argument]]
        for dim, entry in enumerate(spec):
            axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
            wanted[base + dim] = sum(1 << mesh.index(a) for a in axes)
    pinned = np.fromiter(wanted, dtype=np.int64, count=len(wanted))
    allowed = np.fromiter(wanted.values(), dtype=np.uint8, count=len(wanted))
    width = analysis.conflicts.resolution_bits
    state = sharding.initial()
    demoted = []
    order = sorted(pins, key=lambda a: (-int(np.prod(program.values[by_name[a]].shape or (1,))), a))
    for argument in order:
        base = names.def_base[by_name[argument]]
        for dim, entry in enumerate(pins[argument]):
            for axis in () if entry is None else (entry,) if isinstance(entry, str) else entry:
                name, bit = base + dim, 1 << mesh.index(axis)
                if state.masks[name] & bit:
                    continue
                found = None
                for resolution in itertools.product((0, 1), repeat=min(width, MAX_ENUMERATED_BITS)):
                    action = toast.Action(int(analysis.color_of[name]), axis,
                                          tuple(resolution) + (0,) * (width - len(resolution)))
                    candidate = sharding.apply(state, action, check=False)
                    if (candidate.masks[name] & bit and not np.any(candidate.masks[pinned] & ~allowed)
                            and not sharding.problem(candidate)):
                        found = candidate
                        break
                if found is None:
                    demoted.append((argument, dim, axis))
                else:
                    state = found
    return toast.ShardingState(mesh, state.masks, ()), demoted


def count_specs(specs: Iterable[tuple]) -> dict[str, int]:
    """How many arguments have each ``PartitionSpec`` (as JSON text)."""
    counts: dict[str, int] = {}
    for spec in specs:
        counts[json.dumps(spec)] = counts.get(json.dumps(spec), 0) + 1
    return counts


# --- The parent ---------------------------------------------------------------------------------------------------

def autoparallel_installed() -> bool:
    """Whether Meta's AutoParallel imports (not PyPI's unrelated ``autoparallel``, which has no ``api``)."""
    try:
        return importlib.util.find_spec("autoparallel.api") is not None
    except ImportError:
        return False


def versions() -> dict[str, str | None]:
    """Installed versions of the packages compared."""
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def machine() -> dict[str, Any]:
    """This machine: processor, cores, Python."""
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "load_average_at_start": os.getloadavg()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("hidden", 512), ("intermediate", 1408), ("layers", 8), ("heads", 8), ("kv-heads", 2),
                          ("vocab", 32000), ("batch", 8), ("seq", 512), ("rollouts", 2000)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--mesh", default="batch=4,model=2", help="the mesh; its first axis is the data axis")
    parser.add_argument("--hardware", default="h100", help="toast's hardware profile (AutoParallel: its H100)")
    parser.add_argument("--autoparallel-result", type=Path,
                        help="reuse a JSON this benchmark wrote: AutoParallel's placements and seconds from it")
    parser.add_argument("--reprice", type=Path, help="price the plans of a JSON this benchmark wrote again")
    parser.add_argument("--only-autoparallel", action="store_true",
                        help="plan with AutoParallel alone and write its JSON (for --autoparallel-result)")
    parser.add_argument("--out", type=Path, help="the JSON written (default benchmarks/data/autoparallel_<size>.json)")
    parser.add_argument("--child", choices=("toast", "autoparallel"), help=argparse.SUPPRESS)
    parser.add_argument("--child-result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-settings", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        child_settings = json.loads(options.child_settings)
        (plan_toast if options.child == "toast" else plan_autoparallel)(child_settings, options.child_result)
        sys.stdout.flush()
        os._exit(0)  # as the toast command ends: no teardown of the traces counted

    if options.reprice:
        return finish(json.loads(options.reprice.read_text()), options.out or options.reprice)
    settings = {"hidden": options.hidden, "intermediate": options.intermediate, "layers": options.layers,
                "heads": options.heads, "kv_heads": options.kv_heads, "vocab": options.vocab,
                "batch": options.batch, "seq": options.seq, "mesh": options.mesh, "hardware": options.hardware,
                "rollouts": options.rollouts}
    reused = json.loads(options.autoparallel_result.read_text()) if options.autoparallel_result else None
    if reused is None and not autoparallel_installed():
        print("bench_autoparallel: AutoParallel is not installed (github.com/meta-pytorch/autoparallel); skipped")
        return 0
    record: dict[str, Any] = {"settings": settings, "versions": versions(), "machine": machine(),
                              "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                              "attention": "eager", "dtype": "float32"}
    size = f"h{options.hidden}_l{options.layers}_b{options.batch}_s{options.seq}"
    if options.only_autoparallel:
        placements, ap_wall, ap_cpu = run_child("autoparallel", settings)
        record["autoparallel"] = {"wall_s": ap_wall, "cpu_s": ap_cpu, "ilp": placements["ilp"],
                                  "placements": placements}
        out = options.out or ROOT / "benchmarks" / "data" / f"autoparallel_{size}_plan.json"
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"AutoParallel: {ap_wall:.1f} s wall, {ap_cpu:.1f} CPU s, {placements['ilp']['variables']:,} "
              f"variables; written: {out}")
        return 0
    toast_result, toast_wall, toast_cpu = run_child("toast", settings)
    record["toast"] = {"wall_s": toast_wall, "cpu_s": toast_cpu,
                       "search": {k: toast_result["strategy"]["search"].get(k) for k in ("rollouts", "evaluations")},
                       "own_cost": {k: toast_result["strategy"]["cost"].get(k) for k in ("step_time_s", "peak_bytes")}}
    if reused is not None:
        if reused["settings"] != settings:
            raise SystemExit("--autoparallel-result: made with other settings")
        record["autoparallel"] = reused["autoparallel"]
        record["autoparallel_reused_from"] = reused["date"]
        placements = reused["autoparallel"]["placements"]
    else:
        placements, ap_wall, ap_cpu = run_child("autoparallel", settings)
        record["autoparallel"] = {"wall_s": ap_wall, "cpu_s": ap_cpu, "ilp": placements["ilp"],
                                  "placements": placements}
    out = options.out or ROOT / "benchmarks" / "data" / f"autoparallel_{size}.json"
    record["toast"]["strategy"] = toast_result["strategy"]
    out.write_text(json.dumps(record, indent=1) + "\n")  # the plans kept should the pricing fail (--reprice)
    return finish(record, out)


def finish(record: dict[str, Any], out: Path) -> int:
    """Price both plans of ``record`` (``price``), write it to ``out`` and print the table."""
    record["priced"] = price(record["settings"], record["toast"]["strategy"], record["autoparallel"]["placements"])
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))
    print(f"written: {out}")
    return 0


def table(record: Mapping[str, Any]) -> str:
    """The comparison as a Markdown table."""
    plans = record["priced"]["plans"]
    lines = ["| planner | wall s | CPU s | step (toast's cost model) | peak MiB | collectives |",
             "|---|---|---|---|---|---|"]
    for label, timing in (("toast", record["toast"]), ("AutoParallel", record["autoparallel"])):
        plan = plans[label]
        lines.append(f"| {label} | {timing['wall_s']:.1f} | {timing['cpu_s']:.1f} | "
                     f"{plan['step_time_s'] * 1e3:.2f} ms | {plan['peak_bytes'] / 2**20:.1f} | "
                     f"{plan['collectives']} |")
    ilp = record["autoparallel"]["ilp"]
    demoted = len(record["priced"]["demoted_to_stored"])
    lines.append(f"\nAutoParallel's ILP: {ilp['variables']:,} variables, {ilp['constraints']:,} constraints. "
                 f"Its row prices its argument placements with toast's propagation ({demoted} "
                 "computed splits toast's colors could not keep stored split instead); the intermediates' "
                 "placements and redistributions it chose are not carried over.")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
