"""Check a sharded StableHLO module against XLA's own SPMD partitioner on host CPU devices.

A predicted sharding is written into the module the way JAX itself writes it (see below); this
module compiles that text with XLA's SPMD partitioner for a mesh of host CPU devices and
reports three things:

- numerics: the sharded executable and a 1-device reference (the same module with every
  sharding annotation removed) run on the same seeded random inputs, scaled like an initializer
  (``toast.xla.numerics``); every device's output shard is compared with the matching slice of the
  reference output, relative to the output's scale, and the worst outputs are named;
- collectives: the all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute
  instructions of XLA's optimized, partitioned HLO module, each with the mesh axes its device
  groups vary along and its per-device bytes;
- memory: XLA's per-device memory analysis (``CompiledMemoryStats``), in bytes, and its live peak: the
  values live at once at the peak of its schedule, read from the live-range report the sharded compile
  dumps into a temporary folder (``toast.xla.live_range``).

XLA fixes the host CPU device count when JAX starts its backend, so every check runs in a
worker process, ``python -m toast.xla``, started with ``JAX_NUM_CPU_DEVICES`` (the
``jax_num_cpu_devices`` option, which wins over ``XLA_FLAGS=--xla_force_host_platform_device_count``
in jax 0.10) set to the mesh size. The worker reads one JSON request on stdin and writes one
JSON reply on stdout; ``run_worker`` is that protocol, ``check_sharded_module`` and
``lower_sharded`` are the typed front ends.

Annotation forms accepted (both are what ``jax.jit(f, in_shardings=..., out_shardings=...)
.lower(...).as_text()`` prints in jax 0.10):

- Shardy (JAX's default, ``jax_use_shardy_partitioner=True``): a ``sdy.mesh @mesh =
  <["batch"=4, "model"=2]>`` op in the module, ``{sdy.sharding = #sdy.sharding<@mesh,
  [{"batch"}, {}]>}`` on ``@main``'s arguments and results, and ``%1 = sdy.sharding_constraint
  %0 <@mesh, [{"batch"}, {"model"}]> : tensor<256x64xf32>`` on intermediate values;
- GSPMD: ``{mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"}`` on arguments
  and results, and ``stablehlo.custom_call @Sharding(%0) {mhlo.sharding = "{devices=[4,2]<=[8]}"}``
  on intermediate values.

A module using any ``sdy.`` construct is compiled with the Shardy partitioner, any other with
GSPMD. Mesh axes map to device ids in row-major (iota) order: partition ``p`` sits at mesh
coordinates ``numpy.unravel_index(p, sizes)``, as for ``Mesh(np.array(jax.devices()).reshape
(sizes), names)``; an ``sdy.mesh`` with explicit ``device_ids`` is refused.

The compiled module comes from ``LoadedExecutable.hlo_modules()`` (``jaxlib._hlo.HloModule``):
computations, instructions, opcodes, operands and users are walked through that structured
API. jaxlib 0.10.2 ships no HloModuleProto schema and ``HloInstruction`` exposes neither its
shape nor its replica groups, so those two are read from ``HloInstruction.to_string()`` by a
small parser of one HLO instruction line (``toast.xla.hlo_text``): the result shape (array or
tuple, layout skipped), and the ``replica_groups`` or ``source_target_pairs`` attribute. XLA
0.10 prints replica groups in three forms, all read: explicit ``{{0,1},{2,3}}``, iota
``[4,2]<=[4,2]T(1,0)``, and mesh axes ``mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_0'}``
(XLA's own axis names, optionally with ``, device_ids=(...)`` and sub-axes ``'a':(1)2``).
Group members are read as partition ids (the check compiles with one replica).

Limits: a collective inside a loop body is listed once (the list is static, not a trace);
``axes`` names a mesh axis even when the groups span only part of it (a sub-axis), ``groups``
has the exact devices; shard_map (``sdy.manual_computation``) modules are refused.

Memory and time. The worker holds what the comparison needs and no more (see ``_check``): its peak is about
the mesh's devices times what XLA allocates per device (the sharded run, all devices at once), plus the
unsharded outputs and JAX itself; it refuses the sharded run up front where the host has less available. It
names each stage on stderr as it begins (``STAGE_PREFIX``) and reports each stage's peak resident memory
(``XlaReport.worker_peaks``). The caller reads the worker's peak from the kernel while it runs (its address
space's ``VmHWM``), so a worker the out-of-memory killer ended is reported as such, with its peak and stage;
one past its time limit is reported with its stage (``WorkerTimeout``), and with the reason when XLA warned
that a collective waited for the devices' threads (eight of them on two busy cores can take minutes). XLA's
own limit on such a wait (abort after 40 s) is raised to the worker's.

This module is the protocol (the caller's side, the worker's ``main``) and the compile and run; the
worker's other jobs are modules of their own: ``numerics`` (random inputs, shards against the reference),
``hlo_collectives`` (the compiled module's collectives) with ``groups`` (device groups as mesh axes) and
``hlo_text``, ``live_range`` (XLA's live peak), and ``report`` (what the reply holds).

Tests: ``tests/test_xla_check.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from toast.errors import ToastError
from toast.processes import worker_setup
from toast.xla.groups import device_count
from toast.xla.hlo_collectives import hlo_collectives
from toast.xla.live_range import live_peak_from_dump
from toast.xla.numerics import compare_outputs, index_bound, non_negative_arguments, random_input
from toast.xla.report import Numerics, XlaCollective, XlaReport, report_from_json

__all__ = [
    "Numerics",
    "XlaCollective",
    "WorkerTimeout",
    "XlaReport",
    "check_sharded_module",
    "lower_sharded",
    "run_worker",
    "worker_command",
]


# ---- the caller's side ------------------------------------------------------------------


PARENT_PID_VARIABLE = "TOAST_PARENT_PID"
STAGE_PREFIX = "toast-xla-stage: "  # the worker's stderr lines that say what it does now
# XLA aborts a CPU collective whose devices' threads have not all arrived after this many seconds (40 by
# default): on a busy 2-core machine eight devices' threads can take longer without anything being wrong, so the
# worker's own limit is the one that counts.
_COLLECTIVE_TERMINATE_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds"
_STUCK_WARNING = "may be stuck"  # XLA's warning when a collective waits 20 s for the devices' threads


class WorkerTimeout(ToastError):
    """The check worker ran past its time limit.

    Attributes:
      limit_s: the limit, in seconds.
      stage: what the worker was doing (``running the sharded module``), or ``""``.
      stuck: XLA warned that a collective waited for the devices' threads (a busy machine).
    """

    def __init__(self, limit_s: float, stage: str = "", stuck: bool = False, *, option: str = "timeout_s=") -> None:
        self.limit_s, self.stage, self.stuck = limit_s, stage, stuck
        during = f" (it was {stage})" if stage else ""
        why = (": XLA's CPU collectives waited for the devices' threads, which the host's cores did not run in "
               "time (a busy machine?)" if stuck else "")
        super().__init__(f"the XLA check did not finish within {limit_s:g} s{during}{why}; give it longer with "
                         f"{option}SECONDS")


@dataclasses.dataclass(frozen=True)
class _Finished:
    """A worker process that has ended: exit status (``-N`` for signal N), output, its peak resident bytes
    (0 where unknown), and whether it was stopped at its time limit."""

    returncode: int
    stdout: str
    stderr: str
    peak_rss_bytes: int
    timed_out: bool


def worker_command() -> list[str]:
    """The worker's command line (tests put another program in its place)."""
    return [sys.executable, "-m", "toast.xla"]


def run_worker(request: dict[str, Any], *, devices: int, timeout_s: float) -> dict[str, Any]:
    """Run one request in ``python -m toast.xla`` with ``devices`` host CPU devices.

    Args:
      request: ``{"mlir": text, "mesh": {"axes": [[name, size], ...]}, "seed": int}`` for a
        check, or ``{"lower": "module:function", "in_specs": [...], "out_specs": [...],
        "mesh": {...}}`` for lowering (see ``lower_sharded``).
      devices: the host CPU device count of the worker's XLA backend.
      timeout_s: wall-clock limit for the worker, in seconds.

    Returns:
      The worker's JSON reply.

    Raises:
      WorkerTimeout: the worker ran past ``timeout_s`` (the message says during which stage, and whether
        XLA's collectives were waiting for the devices' threads).
      ToastError: the worker failed (the message ends with its last stderr line), was killed (``killed (out
        of memory?)`` with its peak resident memory), or replied with something that is not JSON.
    """
    if devices < 1:
        raise ToastError(f"the XLA check needs at least 1 device, got {devices}")
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    if not any(f.startswith(_COLLECTIVE_TERMINATE_FLAG) for f in flags):
        flags.append(f"{_COLLECTIVE_TERMINATE_FLAG}={math.ceil(timeout_s) + 60}")
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    env["JAX_NUM_CPU_DEVICES"] = str(devices)
    env["JAX_PLATFORMS"] = "cpu"
    env[PARENT_PID_VARIABLE] = str(os.getpid())  # the worker dies with this process (toast.processes)
    command = worker_command()
    try:
        done = _run_process(command, json.dumps(request), env=env, timeout_s=timeout_s)
    except OSError as err:
        raise ToastError(f"cannot start the XLA check worker ({command[0]}): {err.strerror}") from None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    stages = [line[len(STAGE_PREFIX):] for line in lines if line.startswith(STAGE_PREFIX)]
    stage = stages[-1] if stages else ""
    messages = [line for line in lines if not line.startswith(STAGE_PREFIX)]
    if done.timed_out:
        raise WorkerTimeout(timeout_s, stage, any(_STUCK_WARNING in line for line in messages))
    if done.returncode < 0:
        raise ToastError(_death_message(-done.returncode, stage, done.peak_rss_bytes, messages))
    if done.returncode != 0:
        last = messages[-1] if messages else f"exit status {done.returncode}, no message"
        raise ToastError(f"XLA check worker failed: {last}")
    try:
        reply = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise ToastError(f"XLA check worker replied with non-JSON output: {done.stdout[:80]!r}") from None
    if not isinstance(reply, dict):
        raise ToastError("XLA check worker replied with JSON that is not an object")
    return reply


def _death_message(number: int, stage: str, peak_rss_bytes: int, messages: Sequence[str]) -> str:
    """One line for a worker that a signal ended: SIGKILL is most often the kernel's out-of-memory killer."""
    from toast.output.report import human_bytes

    during = f" while {stage}" if stage else ""
    peak = f"; it peaked at {human_bytes(peak_rss_bytes)} resident" if peak_rss_bytes else ""
    if number == signal.SIGKILL:
        return f"XLA check worker was killed (out of memory?){during}{peak}"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    fatal = [line for line in messages if _FATAL_LOG.match(line)]  # XLA's own reason when it aborts (glog F line)
    reason = _FATAL_LOG.sub("", fatal[-1]) if fatal else (messages[-1] if messages else "no message")
    return f"XLA check worker died of {name}{during}{peak}: {reason}"


_FATAL_LOG = re.compile(r"^F\d{4} [\d:.]+\s+\d+ [^\]]*\] ")


def _run_process(command: Sequence[str], request: str, *, env: dict[str, str], timeout_s: float) -> _Finished:
    """Run ``command`` with ``request`` on stdin, stop it (SIGKILL) after ``timeout_s``, and read its peak
    resident memory from the kernel's accounting when it ends (``os.wait4``: known even for a process the
    out-of-memory killer ended)."""
    process = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env)
    chunks: dict[str, bytes] = {}

    def read(name: str, stream: Any) -> None:
        chunks[name] = stream.read()

    def write() -> None:
        assert process.stdin is not None
        try:
            process.stdin.write(request.encode())
            process.stdin.close()
        except (BrokenPipeError, OSError):  # the worker ended before reading it all: its status says why
            pass

    threads = [threading.Thread(target=read, args=("stdout", process.stdout), daemon=True),
               threading.Thread(target=read, args=("stderr", process.stderr), daemon=True),
               threading.Thread(target=write, daemon=True)]
    for thread in threads:
        thread.start()
    lock, ended, timed_out = threading.Lock(), [False], [False]

    def stop() -> None:
        with lock:
            if not ended[0]:  # never signal a pid once reaped (the kernel may have given it to another process)
                timed_out[0] = True
                process.kill()

    timer = threading.Timer(timeout_s, stop)
    timer.daemon = True
    timer.start()
    watched = [0]  # the worker's own high-water mark, as last read
    watcher = threading.Thread(target=_watch_high_water, args=(process.pid, ended, watched), daemon=True)
    watcher.start()
    try:
        if hasattr(os, "waitid"):
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
            with lock:
                ended[0] = True
            _, status, usage = os.wait4(process.pid, 0)
        else:  # no waitid (not Linux): reaped before the timer can know
            _, status, usage = os.wait4(process.pid, 0)
            with lock:
                ended[0] = True
    except BaseException:  # Ctrl-C or SIGTERM in the parent: take the worker down with it
        with lock:
            if not ended[0]:
                process.kill()
        process.wait()
        ended[0] = True  # the watcher stops too
        raise
    finally:
        timer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)
    for thread in threads:
        thread.join()
    watcher.join()
    # Linux carries a process's ru_maxrss across exec, so a worker spawned by a large parent (a test run, a
    # notebook) reports at least the parent's size: its own address space's high-water mark, read while it ran,
    # is the worker's; ru_maxrss only where /proc cannot be read.
    peak = watched[0] or int(usage.ru_maxrss) * (1 if sys.platform == "darwin" else 1024)  # kilobytes on Linux
    return _Finished(process.returncode, chunks.get("stdout", b"").decode(errors="replace"),
                     chunks.get("stderr", b"").decode(errors="replace"), peak, timed_out[0])


def check_sharded_module(mlir_text: str, mesh_axes: Sequence[tuple[str, int]], *, seed: int = 0,
                         timeout_s: float = 600, reference_mlir: str | None = None) -> XlaReport:
    """Compile, run and inspect an annotated StableHLO module on ``prod(sizes)`` CPU devices.

    Args:
      mlir_text: StableHLO text with entry function ``@main`` and sharding annotations in the
        Shardy or GSPMD form JAX prints (see the module docstring).
      mesh_axes: ``[(name, size), ...]`` in mesh order, e.g. ``[("batch", 4), ("model", 2)]``.
      seed: seed of the random inputs.
      timeout_s: wall-clock limit for the worker, in seconds.
      reference_mlir: the program the sharded run is compared with, run on one device (its annotations
        removed); default ``mlir_text`` itself. Its ``@main`` must take and return the same types.

    Raises:
      WorkerTimeout: the worker ran past ``timeout_s``.
      ToastError: bad mesh, a module XLA rejects, an unsupported construct, a host without the memory
        the sharded run needs, or a worker failure.
    """
    mesh = _mesh_json(mesh_axes)
    request: dict[str, Any] = {"mlir": mlir_text, "mesh": mesh, "seed": int(seed)}
    if reference_mlir is not None:
        request["reference"] = reference_mlir
    reply = run_worker(request, devices=device_count(mesh_axes), timeout_s=timeout_s)
    return report_from_json(reply)


def lower_sharded(source: str, mesh_axes: Sequence[tuple[str, int]], *, in_specs: Sequence[Any],
                  out_specs: Sequence[Any], shardy: bool | None = None, timeout_s: float = 600) -> str:
    """JAX's own annotated StableHLO text for a ``module:function`` factory on a mesh.

    The factory returns ``(fn, args)`` as ``toast.examples`` do; the worker lowers
    ``jax.jit(fn, in_shardings=..., out_shardings=...)`` over a ``jax.sharding.Mesh`` of host
    CPU devices in row-major order, inside ``jax.set_mesh(mesh)`` so that ``fn`` may constrain
    intermediates with ``jax.lax.with_sharding_constraint(y, PartitionSpec("batch", "model"))``.

    Args:
      source: ``module:function`` naming the factory, e.g. ``toast.examples.mlp:mlp``.
      mesh_axes: ``[(name, size), ...]`` in mesh order.
      in_specs: one partition spec per flattened argument: a list with one entry per
        dimension, each ``None``, an axis name, or a list of axis names.
      out_specs: one partition spec per flattened output, in the same form.
      shardy: print the Shardy form (``True``) or GSPMD form (``False``); ``None`` keeps JAX's
        default (Shardy in jax 0.10).
      timeout_s: wall-clock limit for the worker, in seconds.

    Returns:
      The text of ``lowered.as_text()``.
    """
    request = {"lower": source, "mesh": _mesh_json(mesh_axes), "in_specs": list(in_specs),
               "out_specs": list(out_specs), "shardy": shardy}
    reply = run_worker(request, devices=device_count(mesh_axes), timeout_s=timeout_s)
    return str(reply["mlir"])


def _mesh_json(mesh_axes: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """``{"axes": [[name, size], ...]}`` after checking names are distinct and sizes positive."""
    axes = [(str(name), int(size)) for name, size in mesh_axes]
    if not axes:
        raise ToastError("the mesh has no axes; give e.g. [('batch', 4), ('model', 2)]")
    names = [name for name, _ in axes]
    if len(set(names)) != len(names):
        raise ToastError(f"mesh axis names repeat: {names}")
    if any(size < 1 for _, size in axes):
        raise ToastError(f"mesh axis sizes must be positive: {axes}")
    return {"axes": [list(axis) for axis in axes]}


# ---- device groups of collectives (pure; used by the worker, testable anywhere) -----------


# ---- the worker's side --------------------------------------------------------------------


def _serve(request: dict[str, Any]) -> dict[str, Any]:
    """Dispatch one request (``lower`` or a check of ``mlir``)."""
    mesh_axes = [(str(name), int(size)) for name, size in request["mesh"]["axes"]]
    if "lower" in request:
        return _lower(request, mesh_axes)
    if "mlir" in request:
        reference = request.get("reference")
        return _check(str(request["mlir"]), mesh_axes, seed=int(request.get("seed", 0)),
                      reference=None if reference is None else str(reference))
    raise ToastError("worker request has neither 'mlir' nor 'lower'")


def _mesh_devices(mesh_axes: Sequence[tuple[str, int]]) -> list[Any]:
    """The first ``prod(sizes)`` host CPU devices (partition order)."""
    import jax

    count = device_count(mesh_axes)
    devices = jax.devices("cpu")
    if len(devices) < count:
        raise ToastError(f"the worker has {len(devices)} CPU devices, the mesh needs {count}")
    return devices[:count]


def _lower(request: dict[str, Any], mesh_axes: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """Lower a ``module:function`` factory with ``jax.jit`` shardings over a host mesh."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from toast.frontend.loading import resolve_factory

    if request.get("shardy") is not None:
        jax.config.update("jax_use_shardy_partitioner", bool(request["shardy"]))
    source = str(request["lower"])
    fn, args = resolve_factory(source)()
    mesh = Mesh(np.array(_mesh_devices(mesh_axes)).reshape([s for _, s in mesh_axes]), [n for n, _ in mesh_axes])

    def sharding(spec: Sequence[Any]) -> Any:
        parts = [tuple(p) if isinstance(p, list) else p for p in spec]
        return NamedSharding(mesh, PartitionSpec(*parts))

    in_specs, out_specs = list(request["in_specs"]), list(request["out_specs"])
    if len(in_specs) != len(jax.tree.leaves(tuple(args))):
        raise ToastError(f"{source}: {len(in_specs)} in_specs for {len(jax.tree.leaves(tuple(args)))} arguments")
    with jax.set_mesh(mesh):  # bare PartitionSpecs in with_sharding_constraint refer to it
        out_shapes = jax.eval_shape(fn, *args)
        out_tree, outputs = jax.tree.structure(out_shapes), len(jax.tree.leaves(out_shapes))
        if len(out_specs) != outputs:
            raise ToastError(f"{source}: {len(out_specs)} out_specs for {outputs} outputs")
        in_shardings = jax.tree.unflatten(jax.tree.structure(tuple(args)), [sharding(s) for s in in_specs])
        out_shardings = jax.tree.unflatten(out_tree, [sharding(s) for s in out_specs])
        lowered = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings).lower(*args)
    return {"mlir": lowered.as_text()}


def _check(text: str, mesh_axes: Sequence[tuple[str, int]], *, seed: int, reference: str | None = None
           ) -> dict[str, Any]:
    """Compile and run unsharded, then sharded, compare, list collectives and memory.

    Memory: what the comparison needs and no more. Inputs are made one argument at a time from their own
    generators (made again for the second run, not kept) and placed straight onto the devices; each executable
    is dropped once run; the reference outputs are kept for the comparison, which drops each output's arrays
    once compared. The worker's peak is about the larger of the reference run (its inputs, temporaries and
    outputs) and the sharded run (the reference outputs, plus every device's inputs, temporaries and outputs:
    the devices times what XLA allocates per device); the sharded run is refused up front where the host has
    less memory available than that (``_memory_shortfall``).
    """
    from jax.interpreters import mlir as jax_mlir

    stages = _Stages()
    stages.begin("reading the module")
    devices = _mesh_devices(mesh_axes)
    context = jax_mlir.make_ir_context()
    module = _parse(text, context, what="the StableHLO module")
    with context:
        shardy = _uses_shardy(module)
        _check_mesh(module, mesh_axes)
        signature = _main_signature(module)
        arguments = signature[0]
        names = _result_names(module)
        if reference is not None:
            module = _parse(reference, context, what="the reference module")
            if _main_signature(module) != signature:
                raise ToastError("the reference module's @main takes or returns other types than the sharded one's")
        reference_text = _strip_shardings(module)
        non_negative = non_negative_arguments(module)
    del module
    high = index_bound(arguments)

    def host_input(index: int) -> Any:
        shape, element_type = arguments[index]
        return random_input(shape, element_type, seed=seed, index=index, high=high,
                            non_negative=index in non_negative)

    stages.begin("compiling the reference")
    unsharded = _compile(reference_text, devices[:1], shardy=False)
    del reference_text
    stages.begin("running the reference")
    expected = [out[0] for out in _execute(unsharded, devices[:1], host_input, len(arguments))]
    del unsharded
    _release_memory()
    stages.begin("compiling the sharded module")
    with tempfile.TemporaryDirectory(prefix="toast-xla-dump-") as dump_dir:
        sharded = _compile(text, devices, shardy=shardy, dump_to=dump_dir)
        hlo_modules = sharded.hlo_modules()
        live_peak = live_peak_from_dump(Path(dump_dir), hlo_modules[0])
    collectives = [c for hlo in hlo_modules for c in hlo_collectives(hlo, mesh_axes)]
    del hlo_modules
    stats = sharded.get_compiled_memory_stats()
    memory = {name: int(getattr(stats, name)) for name in dir(stats)
              if name.endswith("_in_bytes") and isinstance(getattr(stats, name), int)}
    output_shardings = sharded.get_output_shardings()
    _release_memory()  # the compiler's
    per_device = (memory.get("argument_size_in_bytes", 0) + memory.get("output_size_in_bytes", 0)
                  + memory.get("temp_size_in_bytes", 0) - memory.get("alias_size_in_bytes", 0))
    shortfall = _memory_shortfall(per_device, len(devices), _available_bytes())
    if shortfall:
        raise ToastError(shortfall)
    stages.begin("running the sharded module")
    outputs = _execute(sharded, devices, host_input, len(arguments))
    del sharded
    _release_memory()
    stages.begin("comparing the outputs")
    numerics = compare_outputs(outputs, expected, output_shardings, devices, names=names)
    stages.close()
    return {"numerics": numerics, "collectives": [dataclasses.asdict(c) for c in collectives], "memory": memory,
            "live_peak": {"time": live_peak.time,
                          "values": [[v.name, v.bytes, v.kind] for v in live_peak.values]},
            "worker_peaks": [[stage, peak] for stage, peak in stages.peaks]}


def _parse(text: str, context: Any, *, what: str) -> Any:
    """An MLIR module parsed from ``text``."""
    from jaxlib.mlir import ir

    try:
        return ir.Module.parse(text, context=context)
    except ir.MLIRError as err:
        raise ToastError(f"cannot parse {what}: {_first_line(err)}") from None


def _memory_shortfall(per_device: int, devices: int, available: int | None) -> str:
    """Why the sharded run cannot start (``""`` where it can, or where the available memory is unknown): every
    host device allocates what XLA's memory analysis says (arguments, outputs, temporaries) at once, in this
    one process, beside what the worker holds already; on a host with less available the kernel's
    out-of-memory killer would end the worker part way."""
    from toast.output.report import human_bytes

    needed = per_device * devices
    if available is None or needed <= available:
        return ""
    return (f"the sharded run needs about {human_bytes(needed)} ({devices} host devices x {human_bytes(per_device)} "
            f"that XLA allocates for each) and this machine has {human_bytes(available)} available; free memory, "
            f"or validate the program at a smaller size (a smaller batch, fewer layers)")


def _available_bytes() -> int | None:
    """Memory this process may still take: the kernel's ``MemAvailable``, less where the cgroup's limit
    (``memory.max`` less ``memory.current``, cgroup v2) is lower; None where unknown."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text().strip()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _release_memory() -> None:
    """Hand what was freed back to the system: XLA's CPU buffers come from glibc's malloc, which keeps freed
    memory (about 1.5 GB after a GPT-2-size reference run) resident for the next allocations, so the next stage
    would start on top of it. A no-op where the C library is not glibc."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _Stages:
    """The check's stages: each announced on stderr as it begins (``STAGE_PREFIX``: the caller says where a
    stopped or killed worker was), and its peak resident memory: the largest of the resident sizes a thread
    samples every ``_SAMPLE_S`` seconds (``/proc/self/statm``; nothing where there is none). Sampling, not
    resetting the kernel's high-water mark, which would lose the process's peak that the caller reads when the
    worker ends."""

    def __init__(self) -> None:
        self.peaks: list[tuple[str, int]] = []
        self._current = ""
        self._peak = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        if _resident_bytes():
            threading.Thread(target=self._sample, daemon=True, name="toast-xla-rss").start()

    def begin(self, name: str) -> None:
        self.end()
        print(f"{STAGE_PREFIX}{name}", file=sys.stderr, flush=True)
        with self._lock:
            self._current, self._peak = name, _resident_bytes()

    def end(self) -> None:
        with self._lock:
            if self._current:
                self.peaks.append((self._current, max(self._peak, _resident_bytes())))
                self._current = ""

    def close(self) -> None:
        self.end()
        self._done.set()

    def _sample(self) -> None:
        while not self._done.wait(_SAMPLE_S):
            resident = _resident_bytes()
            with self._lock:
                self._peak = max(self._peak, resident)


_SAMPLE_S = 0.02


def _watch_high_water(pid: int, ended: list[bool], watched: list[int]) -> None:
    """Keep ``watched[0]`` at the largest ``VmHWM`` (the peak resident size of the process's own address space,
    Linux ``/proc/PID/status``) of worker ``pid`` until ``ended[0]``; it stays 0 where that cannot be read. The
    last read before a kill misses at most ``_SAMPLE_S`` of growth."""
    status = Path(f"/proc/{pid}/status")
    while not ended[0]:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    watched[0] = max(watched[0], int(line.split()[1]) * 1024)  # kB
                    break
        except (OSError, ValueError, IndexError):  # not Linux, or the worker has just ended (a zombie has no Vm*)
            if not Path("/proc/self/status").exists():
                return
        time.sleep(_SAMPLE_S)


def _resident_bytes() -> int:
    """This process's resident bytes now (Linux ``/proc/self/statm``), 0 where unknown."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _result_names(module: Any) -> list[str]:
    """``@main``'s results as toast names them (``toast.frontend.stablehlo``): ``result`` plus the
    ``jax.result_info`` path (``result[1]['w']``), else ``result[i]``."""
    from jaxlib.mlir import ir

    main = _main_func(module)
    count = len(ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).results)
    res_attrs = ir.ArrayAttr(main.attributes["res_attrs"]) if "res_attrs" in main.attributes else None
    names = []
    for index in range(count):
        label = f"result[{index}]"
        if res_attrs is not None and index < len(res_attrs):
            entries = ir.DictAttr(res_attrs[index])
            if "jax.result_info" in entries:
                info = ir.StringAttr(entries["jax.result_info"]).value
                label = info if info.startswith("result") else f"result{info}" if info else label
        names.append(label)
    return names


def _first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _walk(operation: Any) -> Iterator[Any]:
    """Every operation nested in ``operation`` (pre-order), itself excluded."""
    for region in operation.regions:
        for block in region:
            for op in block:
                yield op.operation
                yield from _walk(op.operation)


def _uses_shardy(module: Any) -> bool:
    """Whether the module carries Shardy (``sdy.``) ops or attributes."""
    for op in _walk(module.operation):
        if op.name.startswith("sdy.") or "sdy.sharding" in op.attributes:
            return True
        if any(key in op.attributes and "#sdy." in str(op.attributes[key]) for key in ("arg_attrs", "res_attrs")):
            return True
    return False


def _check_mesh(module: Any, mesh_axes: Sequence[tuple[str, int]]) -> None:
    """The module's partition count and ``sdy.mesh`` axes agree with ``mesh_axes``."""
    from jaxlib.mlir import ir

    attrs = module.operation.attributes
    count = device_count(mesh_axes)
    if "mhlo.num_partitions" in attrs and ir.IntegerAttr(attrs["mhlo.num_partitions"]).value != count:
        partitions = ir.IntegerAttr(attrs["mhlo.num_partitions"]).value
        raise ToastError(f"the module is partitioned for {partitions} devices, the mesh has {count}")
    for op in _walk(module.operation):
        if op.name != "sdy.mesh":
            continue
        printed = str(op.attributes["mesh"])
        axes = [(name, int(size)) for name, size in re.findall(r'"([^"]+)"=(\d+)', printed)]
        if axes and "device_ids" in printed:
            raise ToastError(f"sdy.mesh with explicit device_ids is not supported: {printed}")
        if axes and axes != list(mesh_axes):
            raise ToastError(f"the module's mesh {axes} differs from the requested mesh {list(mesh_axes)}")


def _main_func(module: Any) -> Any:
    """The ``func.func @main`` operation."""
    from jaxlib.mlir import ir

    for op in module.body:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op.operation
    raise ToastError("the module has no entry function @main")


def _main_signature(module: Any) -> tuple[list[tuple[tuple[int, ...], str]], list[tuple[tuple[int, ...], str]]]:
    """``@main``'s (arguments, results), each ``[(shape, mlir element type), ...]``."""
    from jaxlib.mlir import ir

    function_type = ir.FunctionType(ir.TypeAttr(_main_func(module).attributes["function_type"]).value)

    def describe(types: Sequence[Any]) -> list[tuple[tuple[int, ...], str]]:
        described = []
        for t in types:
            try:
                tensor = ir.RankedTensorType(t)
            except ValueError:
                raise ToastError(f"@main has a non-tensor argument or result of type {t}") from None
            if not tensor.has_static_shape:
                raise ToastError(f"@main has a dynamic shape {t}; only static shapes can be run")
            described.append((tuple(tensor.shape), str(tensor.element_type)))
        return described

    return describe(function_type.inputs), describe(function_type.results)


_DROPPED_ATTRIBUTES = ("sdy.sharding", "mhlo.sharding", "sdy.sharding_rule")


def _strip_shardings(module: Any) -> str:
    """The module's text with every sharding annotation removed, for 1 device.

    Pass-through annotations (``sdy.sharding_constraint``, ``sdy.reshard``, ``custom_call
    @Sharding``) are replaced by their operand; ``sdy.mesh`` and ``sdy.sharding_group`` are
    dropped; ``sdy.sharding``/``mhlo.sharding`` attributes go; ``mhlo.num_partitions`` becomes
    1. Manual computations (shard_map) are refused. The parsed module is changed in place.
    """
    from jaxlib.mlir import ir

    for op in list(_walk(module.operation)):
        name = op.name
        target = ir.StringAttr(op.attributes["call_target_name"]).value if name == "stablehlo.custom_call" else ""
        if name in ("sdy.sharding_constraint", "sdy.reshard") or target == "Sharding":
            op.results[0].replace_all_uses_with(op.operands[0])
            op.erase()
        elif name in ("sdy.mesh", "sdy.sharding_group"):
            op.erase()
        elif name.startswith("sdy.") or target in ("SPMDFullToShardShape", "SPMDShardToFullShape"):
            raise ToastError(f"{name} {target} is not supported by the XLA check (only whole-program shardings)")
        else:
            for key in _DROPPED_ATTRIBUTES:
                if key in op.attributes:
                    del op.attributes[key]
            for key in ("arg_attrs", "res_attrs"):
                if key in op.attributes:
                    op.attributes[key] = _without_shardings(ir.ArrayAttr(op.attributes[key]))
    attrs = module.operation.attributes
    if "mhlo.num_partitions" in attrs:
        attrs["mhlo.num_partitions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)
    return str(module)


def _without_shardings(array: Any) -> Any:
    """An ``arg_attrs``/``res_attrs`` array with the sharding keys dropped from each dict."""
    from jaxlib.mlir import ir

    dicts = []
    for item in array:
        entries = ir.DictAttr(item)
        kept = {entries[i].name: entries[i].attr for i in range(len(entries))
                if entries[i].name not in _DROPPED_ATTRIBUTES}
        dicts.append(ir.DictAttr.get(kept))
    return ir.ArrayAttr.get(dicts)


def _compile(text: str, devices: Sequence[Any], *, shardy: bool, dump_to: str | None = None) -> Any:
    """``backend.compile_and_load`` of StableHLO text for ``len(devices)`` SPMD partitions; with
    ``dump_to``, XLA writes its text dumps there (the live-range report among them)."""
    import numpy as np
    from jax.errors import JaxRuntimeError
    from jax.extend.backend import get_backend, get_compile_options
    from jaxlib import xla_client

    backend = get_backend("cpu")
    ids = np.array([[d.id for d in devices]])
    # Values keep their own types (XLA refuses the string "true" for a bool option); the stub says str.
    dump: Any = {"xla_dump_to": dump_to, "xla_dump_hlo_as_text": True} if dump_to else None
    options = get_compile_options(num_replicas=1, num_partitions=len(devices), device_assignment=ids,
                                  backend=backend, env_options_overrides=dump)
    options.executable_build_options.use_shardy_partitioner = shardy
    try:
        return backend.compile_and_load(text, xla_client.DeviceList(tuple(devices)), options)
    except JaxRuntimeError as err:
        raise ToastError(f"XLA cannot compile the module for {len(devices)} devices: {_first_line(err)}") from None


def _execute(executable: Any, devices: Sequence[Any], make_input: Any, count: int) -> list[list[Any]]:
    """Run with ``count`` inputs, each made by ``make_input(index)`` (a numpy array) and placed by the
    executable's parameter shardings (each device gets its slice; no host copy is kept); per output, the
    per-device result arrays."""
    import jax
    from jax.extend.sharding import GSPMDSharding

    shardings = executable.get_parameter_shardings() if len(devices) > 1 else None
    arrays = []
    for index in range(count):
        value = make_input(index)
        if shardings is None:
            arrays.append(jax.device_put(value, jax.sharding.SingleDeviceSharding(devices[0])))
        else:
            placement = GSPMDSharding(tuple(devices), shardings[index])
            arrays.append(jax.make_array_from_callback(value.shape, placement, value.__getitem__))
        del value
    results = executable.execute_sharded(arrays)
    del arrays
    outputs = results.disassemble_into_single_device_arrays()
    jax.block_until_ready(outputs)  # the run ends here, within its own stage (execution is asynchronous)
    return outputs


def main() -> None:
    """Worker entry: one JSON request on stdin, one JSON reply on stdout, errors on stderr."""
    parent = os.environ.get(PARENT_PID_VARIABLE, "")
    if parent.isdigit():
        worker_setup(int(parent))
    reply_stream = sys.stdout
    sys.stdout = sys.stderr  # keep stray prints of user code out of the reply
    try:
        request = json.load(sys.stdin)
        reply = _serve(request)
    except ToastError as err:
        print(str(err), file=sys.stderr)
        sys.exit(2)
    except Exception as err:  # noqa: BLE001 - anything else, reported as one line with its type
        print(f"{type(err).__name__}: {_first_line(err)}", file=sys.stderr)
        sys.exit(1)
    json.dump(reply, reply_stream)
    reply_stream.flush()


if __name__ == "__main__":
    main()
