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
import re
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
        "mesh": _mesh_json(model.mesh.axes, model.mesh.slices),
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


def _mesh_json(axes: Sequence[tuple[str, int]], slices: int) -> dict[str, Any]:
    """A document's ``mesh``: its axes, and its slices where there are several (``Mesh.slices``)."""
    return {"axes": [[axis, size] for axis, size in axes], **({"slices": slices} if slices > 1 else {})}


def cost_document(cost: Any, live: Sequence[Any], *, program: str, source: str, hardware: str,
                  mesh_axes: Sequence[tuple[str, int]], strategy: str | None, donate: Sequence[int], overlap: bool,
                  microbatches: int, slices: int = 1) -> dict[str, Any]:
    """``toast cost --json``'s document (``schemas/cost.schema.json``): what was priced, how, the cost
    (``cost_json``'s keys) and the ``LiveBuffer``s at the peak."""
    return {
        "program": program, "source": source, "hardware": hardware,
        "mesh": _mesh_json(mesh_axes, slices),
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


class _NonStandardConstant(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a file: Python's ``json`` reads them, JSON has none."""


def _refuse_constant(name: str) -> Any:
    raise _NonStandardConstant(name)


# A JSON string (skipped: "NaN" may be a name) or a non-standard constant.
_CONSTANT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


def _constant_position(text: str) -> tuple[int, int]:
    """``(line, column)``, from 1, of the first ``NaN``/``Infinity`` outside a string of ``text``."""
    for match in _CONSTANT.finditer(text):
        if match.group(1):
            start = match.start(1)
            return text.count("\n", 0, start) + 1, start - text.rfind("\n", 0, start)
    return 1, 1


def _non_finite(value: Any, where: str) -> str:
    """The JSON path (``cost.step_time_s``) of the first NaN or infinite number in a loaded document, ``""``
    where there is none."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the document"
    items = (value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ())
    for key, item in items:
        found = _non_finite(item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key)
        if found:
            return found
    return ""


def read_strategy_document(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """A strategy document, checked: the file at ``source`` or a document already loaded. Every
    consumer (``toast validate``, ``sharded_jit``) reads strategies through this.

    Raises:
      ToastError: unreadable, not JSON (``path:line:col``; ``NaN`` and ``Infinity`` are not JSON, and a
        number past float's range is refused too), not conforming to the strategy schema
        (``schema("strategy")``), naming mesh axes the mesh lacks, or with collectives whose bytes the
        mesh's axis sizes contradict (a mesh edited after the file was written).
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
            document = json.loads(text, parse_constant=_refuse_constant)
        except json.JSONDecodeError as err:
            raise ToastError(f"{where}:{err.lineno}:{err.colno}: not a strategy file "
                             f"(invalid JSON: {err.msg})") from None
        except _NonStandardConstant as err:
            line, column = _constant_position(text)
            raise ToastError(f"{where}:{line}:{column}: not a strategy file (invalid JSON: {err.args[0]} is not "
                             "a JSON number)") from None
        except RecursionError:
            raise ToastError(f"{where}: not a strategy file (JSON nested too deeply)") from None
    try:
        found = _non_finite(document, "")  # a document given loaded, or a number past float's range (1e999)
    except RecursionError:
        raise ToastError(f"{where}: not a strategy file (nested too deeply)") from None
    if found:
        raise ToastError(f"{where}: not a strategy file: {found} is not a finite number (costs and sizes are)")
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
    _check_collective_sizes(document, sizes, where=where)
    return document


def _check_collective_sizes(document: dict[str, Any], sizes: dict[str, int], *, where: str) -> None:
    """What the mesh's axis sizes imply for the file's collectives, without the program: an all-gather's result is
    its operand on each device of its axes (a reduce-scatter's operand the reverse), so their bytes per device are
    in the ratio of the axes' devices (to within a byte per device where sub-byte elements are packed). A mesh
    edited after the file was written (``batch=2,model=4`` made ``batch=4,model=2``) breaks it."""
    mesh = ",".join(f"{axis}={size}" for axis, size in sizes.items())
    for k, collective in enumerate(document.get("collectives", ())):
        unknown = sorted(set(collective["axes"]) - set(sizes))
        if unknown:
            raise ToastError(f"{where}: collectives[{k}]: names mesh axis '{unknown[0]}', which the mesh "
                             f"{sorted(sizes)} lacks")
        devices = math.prod(sizes[axis] for axis in collective["axes"])
        kind, bytes_in, bytes_out = collective["kind"], collective["bytes_in"], collective["bytes_out"]
        if kind == "all-gather":
            small, large = bytes_in, bytes_out
        elif kind == "reduce-scatter":
            small, large = bytes_out, bytes_in
        elif kind == "collective-permute":
            if bytes_in != bytes_out:  # a halo exchange receives as many bytes as it sends
                raise ToastError(f"{where}: collectives[{k}] (collective-permute over "
                                 f"{'+'.join(collective['axes'])}) takes {bytes_in} bytes per device to {bytes_out}; "
                                 f"a collective-permute receives as many bytes as it sends. {_REWRITE}")
            continue
        else:
            continue  # an all-reduce or all-to-all moves as many bytes as it keeps: no size to check
        if not small * devices - (devices - 1) <= large <= small * devices:
            raise ToastError(f"{where}: the mesh {mesh} does not match the strategy's collectives: collectives[{k}] "
                             f"({kind} over {'+'.join(collective['axes'])}) takes {bytes_in} bytes per device to "
                             f"{bytes_out}, not a ratio of {devices} devices; was the mesh edited? {_REWRITE}")


_REWRITE = "Write the file again on the mesh you want (`toast shard -o` or `toast autoshard -o`)"


def strategy_hardware(document: dict[str, Any], *, path: str | Path) -> Hardware:
    """The hardware profile a strategy document was made for: the one it records whole, else the bundled
    profile or TOML file it names."""
    text = document.get("hardware_profile")
    if isinstance(text, str) and text:
        return hardware_from_text(text, f"{path}: hardware_profile")
    return load_hardware(str(document["hardware"]))


def strategy_mesh(document: dict[str, Any], *, path: str | Path) -> Mesh:
    """The mesh a strategy document was made for, on the slices it records (1 where it records none)."""
    try:
        spec = ",".join(f"{name}={int(size)}" for name, size in document["mesh"]["axes"])
        slices = document["mesh"].get("slices", 1)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ToastError(f"{path}: malformed 'mesh' (expected {{\"axes\": [[name, size], ...]}})") from None
    try:
        return parse_mesh(spec, slices=slices)
    except ToastError as err:
        raise ToastError(f"{path}: malformed 'mesh': {err}") from None


def strategy_state(model: ShardingModel, document: dict[str, Any], *, path: str | Path) -> ShardingState:
    """The sharding state a strategy document holds, checked against ``model``'s program.

    Raises:
      ToastError: the file was written for another program (fingerprint), another analysis
        (name count or variant), or another mesh, its state is malformed, or its specs or collectives are
        not what its state gives on its mesh (an edited file: a mesh whose sizes were changed shows in the
        collectives' bytes).
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
    if "collectives" in document:
        _check_collectives(model, found, document["collectives"], path=path)
    return found


def _check_collectives(model: ShardingModel, state: ShardingState, listed: Sequence[dict[str, Any]], *,
                       path: str | Path) -> None:
    """The file's collectives must be those its state needs on its mesh: their bytes per device follow from the
    mesh's axis sizes, so a mesh edited after the file was written (the axes kept, their sizes changed, which
    leaves the state and the specs valid) shows here. Value names and locations are not compared: a value's name
    may come from where the program's source lies, which the fingerprint leaves out."""
    from toast.cost.collectives import CommunicationModel

    program = model.analysis.program
    needed = [_collective_json(program, c) for c in CommunicationModel(model).collectives(state)]
    mesh = model.mesh.spec()
    for k, (given, wanted) in enumerate(zip(listed, needed, strict=False)):
        what = f"the {wanted['kind']} of {wanted['value']} over {'+'.join(wanted['axes'])}"
        if any(given.get(key, wanted[key]) != wanted[key] for key in ("kind", "axes", "op", "operand")):
            raise ToastError(f"{path}: collectives[{k}] ({given['kind']} over {'+'.join(given['axes'])}) is not what "
                             f"the state needs on mesh {mesh} ({what}); was the file edited? {_REWRITE}")
        side, verb = ("bytes_in", "moves") if given["bytes_in"] != wanted["bytes_in"] else ("bytes_out", "gives")
        if given[side] != wanted[side]:
            raise ToastError(f"{path}: the mesh {mesh} does not match the strategy's state: collectives[{k}] "
                             f"({what}) {verb} {wanted[side]} bytes per device on this mesh, the file says "
                             f"{given[side]}; was the mesh edited? {_REWRITE}")
    if len(listed) != len(needed):
        raise ToastError(f"{path}: {len(listed)} collectives, the state needs {len(needed)} on mesh {mesh}; was the "
                         f"file edited? {_REWRITE}")
