"""Strategy files: a sharding state written down for people, scripts and JAX.

The JSON (``toast shard -o FILE``) holds the mesh, the hardware, the actions, the sharding of
every function argument and result as ``jax.sharding.PartitionSpec`` entries (``null``, an
axis name, or a list of axis names per dim), the predicted collectives, the cost breakdown,
a fingerprint of the program so a strategy is never applied to another program, and the
state itself (one byte of axis bits per dimension name, zlib-compressed, base64) so that
``toast validate`` replays exactly what was estimated.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toast.cost.collectives import Collective
from toast.cost.hardware import Hardware, hardware_from_text, load_hardware
from toast.cost.model import Cost
from toast.errors import ToastError
from toast.frontend.ir import Program
from toast.sharding.mesh import Mesh, parse_mesh
from toast.sharding.state import Action, ShardingModel, ShardingState, spec_entries


def strategy_json(model: ShardingModel, state: ShardingState, actions: Sequence[Any], cost: Cost, *,
                  source: str, hardware: Hardware, name: str, donate: Sequence[int] = (),
                  search: dict[str, Any] | None = None) -> dict[str, Any]:
    """The strategy document of ``state`` (deterministic order); ``search``: how ``toast autoshard`` found it.
    The hardware profile is recorded by name and, where it was read from TOML, whole (``hardware_profile``),
    so the file can be priced and validated where the profile file is not."""
    program = model.analysis.program
    arguments, results = _tensors_json(model, state)
    return {
        "program": program.name,
        "source": source,
        "fingerprint": program.fingerprint(),
        "variant": str(model.analysis.stats.get("variant", "default")),
        "mesh": {"axes": [[axis, size] for axis, size in model.mesh.axes]},
        "hardware": hardware.name,
        **({"hardware_profile": hardware.text} if hardware.text else {}),
        "strategy": name,
        "actions": [_action_json(model, action) for action in actions],
        "state": {"names": int(len(state.masks)),
                  "masks": base64.b64encode(zlib.compress(state.masks.tobytes(), 9)).decode("ascii")},
        "arguments": arguments,
        "results": results,
        "collectives": [_collective_json(program, c) for c in cost.collectives],
        **({"donate": sorted(donate)} if donate else {}),
        **({"search": search} if search is not None else {}),
        "cost": cost_json(cost),
    }


def _tensors_json(model: ShardingModel, state: ShardingState) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``arguments`` and ``results`` entries of a strategy document: name, shape, dtype and the
    ``PartitionSpec`` entries ``state`` gives each (a list for several axes on one dim)."""
    program = model.analysis.program

    def tensor(value_id: int, dim_axes: Sequence[tuple[str, ...]]) -> dict[str, Any]:
        value = program.values[value_id]
        spec = [list(entry) if isinstance(entry, tuple) else entry for entry in spec_entries(dim_axes)]
        return {"name": value.name, "shape": list(value.shape), "dtype": value.dtype, "partition_spec": spec}

    return ([tensor(v, model.value_axes(state, v)) for v in program.arguments],
            [tensor(v, model.result_axes(state, k)) for k, v in enumerate(program.results)])


def cost_json(cost: Any) -> dict[str, Any]:
    """A ``Cost`` as JSON: ``step_time_s``, ``peak_bytes`` (per device), ``breakdown`` (seconds), ``kernels``
    (launches per step), ``collectives`` (count, as partitioned), ``collectives_launched`` (after combining),
    ``communication_s`` (seconds per mesh axis set), ``exposed_communication_s`` (the part of it the step waits
    for, per mesh axis set), ``communication_by_level_s`` (seconds per interconnect level), ``relative`` (C(s)).
    The same keys in ``toast cost --json`` and a strategy file's ``cost``."""
    return {
        "step_time_s": cost.step_time_s,
        "peak_bytes": cost.peak_bytes,
        "breakdown": dict(cost.breakdown),
        "kernels": cost.kernels,
        "collectives": len(cost.collectives),
        "collectives_launched": cost.collectives_launched,
        "communication_s": dict(sorted(cost.communication_s.items())),
        "exposed_communication_s": dict(sorted(cost.exposed_communication_by_axes_s.items())),
        "communication_by_level_s": dict(sorted(cost.communication_by_level_s.items())),
        "relative": cost.relative,
    }


def cost_document(cost: Any, live: Sequence[Any], *, program: str, source: str, hardware: str,
                  mesh_axes: Sequence[tuple[str, int]], strategy: str | None, donate: Sequence[int], overlap: bool,
                  microbatches: int) -> dict[str, Any]:
    """``toast cost --json``'s document (``schemas/cost.schema.json``): what was priced, how, the cost
    (``cost_json``'s keys) and the ``LiveBuffer``s at the peak."""
    return {
        "program": program, "source": source, "hardware": hardware,
        "mesh": {"axes": [[axis, size] for axis, size in mesh_axes]},
        "strategy": strategy, "donate": list(donate), "overlap": overlap, "microbatches": microbatches,
        **cost_json(cost),
        "live_at_peak": [{"value": b.name, "shape": list(b.shape), "dtype": b.dtype, "bytes": b.bytes, "loc": b.loc}
                         for b in live],
    }


def _action_json(model: ShardingModel, action: Any) -> dict[str, Any]:
    if isinstance(action, Action):
        return {"color": action.color, "axis": action.axis, "resolution": list(action.resolution)}
    from toast.analysis.naming import describe_name

    return {"nodes": [describe_name(model.analysis, n) for n in action.nodes], "axis": action.axis,
            "label": action.label}


def _collective_json(program: Program, collective: Collective) -> dict[str, Any]:
    op = program.ops[collective.op]
    return {
        "kind": collective.kind,
        "axes": list(collective.axes),
        "value": program.values[collective.value].name,
        "op": op.kind,
        "operand": collective.operand,
        "loc": op.loc,
        "bytes_in": collective.bytes_in,
        "bytes_out": collective.bytes_out,
    }


SCHEMAS = Path(__file__).parent / "schemas"


@functools.cache
def schema(name: str) -> dict[str, Any]:
    """A published JSON Schema: ``strategy`` (strategy files), ``analysis`` (``toast analyze --json``) or
    ``cost`` (``toast cost --json``), from ``toast/output/schemas/<name>.schema.json``."""
    return dict(json.loads((SCHEMAS / f"{name}.schema.json").read_text()))


def schema_problem(document: Any, name: str) -> str:
    """The most relevant violation of schema ``name`` by ``document`` in words (with where it is,
    as a JSON path), ``""`` when it conforms."""
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema(name)).iter_errors(document))
    if error is None:
        return ""
    where = "" if error.json_path == "$" else f" at {error.json_path}"
    return f"{error.message}{where}"


def read_strategy_document(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """A strategy document, checked: the file at ``source`` or a document already loaded. Every
    consumer (``toast validate``, ``sharded_jit``) reads strategies through this.

    Raises:
      ToastError: unreadable, not JSON (``path:line:col``), not conforming to the strategy
        schema (``schema("strategy")``), or naming mesh axes the mesh lacks.
    """
    if isinstance(source, dict):
        document, where = source, "strategy"
    else:
        where = str(source)
        try:
            text = Path(source).read_text()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
            raise ToastError(f"{where}: cannot read: {reason}") from None
        try:
            document = json.loads(text)
        except json.JSONDecodeError as err:
            raise ToastError(f"{where}:{err.lineno}:{err.colno}: not a strategy file "
                             f"(invalid JSON: {err.msg})") from None
    problem = schema_problem(document, "strategy")
    if problem:
        raise ToastError(f"{where}: not a valid strategy file: {problem} (write one with `toast shard -o`)")
    sizes = {name: size for name, size in document["mesh"]["axes"]}
    axes = set(sizes)
    for kind in ("arguments", "results"):
        for k, tensor in enumerate(document[kind]):
            named = [a for entry in tensor["partition_spec"] if entry is not None
                     for a in ([entry] if isinstance(entry, str) else entry)]
            unknown = sorted(set(named) - axes)
            if unknown or len(named) != len(set(named)) or len(tensor["partition_spec"]) > len(tensor["shape"]):
                why = (f"names mesh axis '{unknown[0]}', which the mesh {sorted(axes)} lacks" if unknown else
                       "uses a mesh axis twice" if len(named) != len(set(named)) else "has more entries than dims")
                raise ToastError(f"{where}: {kind}[{k}] ({tensor['name']}): the partition_spec {why}")
            for dim, entry in enumerate(tensor["partition_spec"]):
                entry_axes = [] if entry is None else [entry] if isinstance(entry, str) else entry
                devices = math.prod(sizes[axis] for axis in entry_axes)
                if tensor["shape"][dim] % devices:
                    raise ToastError(f"{where}: {kind}[{k}] ({tensor['name']}): dim {dim} of size "
                                     f"{tensor['shape'][dim]} is not divisible by the {devices} devices of "
                                     f"{'+'.join(entry_axes)}")
    return document


def strategy_hardware(document: dict[str, Any], *, path: str | Path) -> Hardware:
    """The hardware profile a strategy document was made for: the one it records whole, else the bundled
    profile or TOML file it names."""
    text = document.get("hardware_profile")
    if isinstance(text, str) and text:
        return hardware_from_text(text, f"{path}: hardware_profile")
    return load_hardware(str(document["hardware"]))


def strategy_mesh(document: dict[str, Any], *, path: str | Path) -> Mesh:
    """The mesh a strategy document was made for."""
    try:
        spec = ",".join(f"{name}={int(size)}" for name, size in document["mesh"]["axes"])
    except (KeyError, TypeError, ValueError):
        raise ToastError(f"{path}: malformed 'mesh' (expected {{\"axes\": [[name, size], ...]}})") from None
    try:
        return parse_mesh(spec)
    except ToastError as err:
        raise ToastError(f"{path}: malformed 'mesh': {err}") from None


def strategy_state(model: ShardingModel, document: dict[str, Any], *, path: str | Path) -> ShardingState:
    """The sharding state a strategy document holds, checked against ``model``'s program.

    Raises:
      ToastError: the file was written for another program (fingerprint), another analysis
        (name count or variant), or another mesh, or its state is malformed.
    """
    program = model.analysis.program
    fingerprint = program.fingerprint()
    if document["fingerprint"] != fingerprint:
        raise ToastError(f"{path}: strategy file for another program (fingerprint {document['fingerprint']}, "
                         f"{program.name} has {fingerprint}; source was {document.get('source', '?')})")
    variant = str(model.analysis.stats.get("variant", "default"))
    if document.get("variant", variant) != variant:
        raise ToastError(f"{path}: strategy made with analysis variant '{document['variant']}', this analysis uses "
                         f"'{variant}'; pass --variant {document['variant']}")
    mesh = strategy_mesh(document, path=path)
    if mesh.axes != model.mesh.axes:
        raise ToastError(f"{path}: strategy for mesh {mesh.spec()}, not {model.mesh.spec()}")
    try:
        state = document["state"]
        masks = np.frombuffer(zlib.decompress(base64.b64decode(state["masks"], validate=True)), dtype=np.uint8)
        names = int(state["names"])
    except (KeyError, TypeError, ValueError, zlib.error):
        raise ToastError(f"{path}: malformed 'state' (write the file with `toast shard -o`)") from None
    if names != len(masks) or names != model.analysis.names.count:
        raise ToastError(f"{path}: state has {len(masks)} dimension names, the analysis has "
                         f"{model.analysis.names.count}; were other rules (--rules) used?")
    if len(masks) and int(masks.max()) >= 1 << len(mesh.axes):
        raise ToastError(f"{path}: state names mesh axes the mesh {mesh.spec()} does not have")
    found = ShardingState(model.mesh, masks.copy(), ())
    problem = model.problem(found)
    if problem:
        raise ToastError(f"{path}: the state is not a valid sharding ({problem}); write the file with `toast shard -o`")
    # What `validate` and `cost` replay (the state) must be what `Strategy.apply` runs (the specs).
    for kind, expected in zip(("arguments", "results"), _tensors_json(model, found), strict=True):
        for k, (given, wanted) in enumerate(zip(document[kind], expected, strict=False)):
            spec = list(given["partition_spec"]) + [None] * (len(wanted["shape"]) - len(given["partition_spec"]))
            for field_name, value, want in (("name", given["name"], wanted["name"]),
                                            ("shape", given["shape"], wanted["shape"]),
                                            ("dtype", given["dtype"], wanted["dtype"]),
                                            ("partition_spec", spec, wanted["partition_spec"])):
                if value != want:
                    raise ToastError(f"{path}: {kind}[{k}] ({given['name']}): {field_name} {json.dumps(value)} does "
                                     f"not match the file's state and program ({json.dumps(want)}); was the file "
                                     "edited? Write it with `toast shard -o`")
        if len(document[kind]) != len(expected):
            raise ToastError(f"{path}: {len(document[kind])} {kind}, the program has {len(expected)}")
    return found
