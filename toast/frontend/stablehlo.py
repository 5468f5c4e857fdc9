"""StableHLO in, ``toast.frontend.ir.Program`` out.

Two inputs:
  * a JAX callable with example arguments (arrays or ``jax.ShapeDtypeStruct``), lowered with
    ``jax.jit(fn).lower(*args)`` and printed with debug locations;
  * a StableHLO ``.mlir`` text file such as ``lowered.as_text(debug_info=True)`` writes.

The module is read with the MLIR Python bindings that ship in jaxlib. Private functions
reached by ``func.call`` are inlined at each call site (the analysis is context-sensitive:
two calls of one ``relu`` must not share dimension names); ``stablehlo.while``/``case``
regions are kept as nested ops whose block arguments and terminators the rules connect.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import os
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toast.errors import InputError
from toast.frontend.ir import Op, Program, Value
from toast.frozen import constructor

_MAX_INLINE_DEPTH = 64

# ``jaxlib.mlir.ir``, imported on first use (``_load_ir``) rather than with toast: importing it
# loads XLA's runtime, which fixes its logging settings then (the CLI quiets them first).
ir: Any = None


def _load_ir() -> Any:
    global ir
    if ir is None:
        from jaxlib.mlir import ir as bindings

        ir = bindings
    return ir


def lower_callable(fn: Callable[..., Any], args: Sequence[Any]) -> str:
    """Lower ``fn(*args)`` with ``jax.jit`` and return StableHLO text with debug locations."""
    import jax

    lowered = jax.jit(fn).lower(*args)
    return lowered.as_text(debug_info=True)


def read_callable(fn: Callable[..., Any], args: Sequence[Any], *, name: str = "") -> Program:
    """Lower a JAX callable and read the result (see ``lower_callable``)."""
    return read_text(lower_callable(fn, args), source=name or getattr(fn, "__name__", "fn"))


# The first bytes of MLIR bytecode (``Operation.write_bytecode``, StableHLO portable artifacts).
MLIR_BYTECODE_MAGIC = b"ML\xefR"


def read_file(path: str | os.PathLike[str]) -> Program:
    """Read a StableHLO ``.mlir`` file: text, MLIR bytecode, or a StableHLO portable artifact
    (the VHLO bytecode ``jax.export`` and ``stablehlo.serialize_portable_artifact`` write)."""
    return read_text(file_text(path), source=str(path))


def file_text(path: str | os.PathLike[str]) -> str:
    """The StableHLO text of a ``.mlir`` file (``read_file``'s inputs; bytecode is printed as text)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    if data.startswith(MLIR_BYTECODE_MAGIC):
        return _bytecode_text(data, source=str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: neither StableHLO text nor MLIR bytecode (byte {err.start} is not UTF-8 "
                         "and the file does not start with the bytecode header)") from None


# Seconds a child process that reads a suspect input (``_in_child``) may take.
CHILD_TIMEOUT_S = 30.0


def _bytecode_text(data: bytes, *, source: str) -> str:
    """The text (with locations) of a module in MLIR bytecode, or of a StableHLO portable
    artifact (VHLO), which is upgraded to the current StableHLO first.

    Read in a child process: MLIR's bytecode reader can crash the process on corrupt bytecode
    (a segmentation fault), and that must end in one error line, not take toast down."""
    return _in_child("bytecode", data, source=source,
                     crashed="unreadable MLIR bytecode: MLIR's bytecode reader crashed on it").decode("utf-8")


def _in_child(reader: str, data: bytes, *, source: str, crashed: str) -> bytes:
    """Run ``_child_main`` (``reader`` on ``data``) in a child process and return what it writes.

    Raises:
      InputError: the reader's own one-line error, or ``source: crashed`` when the child dies
        (a crash of MLIR's C++ code) or outlasts ``CHILD_TIMEOUT_S``.
    """
    import subprocess
    import sys

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1")}
    command = [sys.executable, "-c", "from toast.frontend.stablehlo import _child_main; _child_main()", reader, source]
    try:
        done = subprocess.run(command, input=data, capture_output=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise InputError(f"{source}: {crashed} (it ran over {CHILD_TIMEOUT_S:g} s)") from None
    if done.returncode == 0:
        return done.stdout
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    if done.returncode == 2 and lines:
        raise InputError(lines[-1])
    raise InputError(f"{source}: {crashed} (exit status {done.returncode})")


def _child_main() -> None:
    """A child process of ``_in_child``: ``argv`` is (reader, source), the input is on stdin;
    the result goes to stdout, or the one-line error to stderr with exit status 2."""
    import sys

    reader, source = sys.argv[1], sys.argv[2]
    data = sys.stdin.buffer.read()
    try:
        if reader == "bytecode":
            sys.stdout.buffer.write(_bytecode_text_here(data, source=source).encode("utf-8"))
        else:  # "text": only whether it reads (the caller then reads it in its own process)
            _read_text_here(data.decode("utf-8"), source=source)
    except InputError as err:
        print(err, file=sys.stderr)
        sys.exit(2)


def _bytecode_text_here(data: bytes, *, source: str) -> str:
    """``_bytecode_text`` in this process."""
    _load_ir()
    from jax.extend.mlir import deserialize_portable_artifact
    from jax.interpreters import mlir as jax_mlir

    context = jax_mlir.make_ir_context()
    # Errors go to this handler, not into the MLIRError the bindings build: for some corrupt
    # bytecode building that error aborts the process (a string that is not UTF-8).
    errors: list[str] = []

    def collect(diagnostic: Any) -> bool:
        if diagnostic.severity == ir.DiagnosticSeverity.ERROR:
            try:
                errors.append(str(diagnostic.message))
            except RuntimeError:  # the message holds bytes that are not UTF-8
                errors.append("corrupt module (its error message is not UTF-8 text)")
        return True

    context.emit_error_diagnostics = True
    handler: Any = context.attach_diagnostic_handler(collect)
    with context:
        try:
            module = ir.Module.parse(data, context=context)
            if any(op.operation.name.startswith("vhlo.") for op in module.body.operations):
                module = deserialize_portable_artifact(data, context)  # versioned: upgrade to StableHLO
        except Exception as err:  # MLIRError, or the bindings' own error types for VHLO
            diagnostics = getattr(err, "error_diagnostics", None)
            reason = (errors[0] if errors else diagnostics[0].message if diagnostics
                      else (str(err).strip().splitlines() or [type(err).__name__])[0])
            first = reason.splitlines()[0] if reason else reason
            raise InputError(f"{source}: unreadable MLIR bytecode: {first}") from None
        finally:
            handler.detach()
        return str(module.operation.get_asm(enable_debug_info=True))


def read_text(text: str, *, source: str = "<string>") -> Program:
    """Parse StableHLO text and build the inlined ``Program``.

    Raises:
      InputError: malformed text (``source:line:col: message``), no entry function, or a
        value of dynamic shape.
    """
    if _has_high_byte_escape(text):
        # MLIR's bindings stop the process (C++ terminate) when a string they hand to Python,
        # a location's file name or a value's name, is not UTF-8; a ``\\XX`` escape of a byte
        # >= 0x80 in a string literal can make one. Such text is first read in a child process.
        _in_child("text", text.encode("utf-8"), source=source,
                  crashed="a string escape in it is not UTF-8 text once read; MLIR's bindings stopped "
                          "the reading process")
    return _read_text_here(text, source=source)


def _has_high_byte_escape(text: str) -> bool:
    """Whether ``text`` holds a backslash followed by two hex digits spelling a byte >= 0x80."""
    if "\\" not in text:
        return False
    hex_digits = "0123456789abcdefABCDEF"
    return any(len(chunk) >= 2 and chunk[0] in "89abcdefABCDEF" and chunk[1] in hex_digits
               for chunk in text.split("\\")[1:])


def _read_text_here(text: str, *, source: str) -> Program:
    """``read_text`` in this process."""
    _load_ir()
    from jax.interpreters import mlir as jax_mlir

    context = jax_mlir.make_ir_context()
    try:
        module = ir.Module.parse(text, context=context)
    except ir.MLIRError as err:
        with context:
            message = _parse_error_line(source, err)
        raise InputError(message) from None
    with context:
        return _Reader(module, source).program(text=text)


def entry_function(functions: dict[str, Any], source: str) -> Any:
    """``@main`` among a module's ``func.func`` ops by name, else its one public function."""
    if "main" in functions:
        return functions["main"]
    public = [f for f in functions.values()
              if "sym_visibility" not in f.attributes or f.attributes["sym_visibility"].value == "public"]
    if len(public) != 1:
        raise InputError(f"{source}: no entry function: expected func.func @main or one public function")
    return public[0]


def read_module(module: Any, *, source: str) -> tuple[Program, list[tuple[Any, bool]]]:
    """Read a parsed module (inside its context) and trace where each op came from.

    Returns:
      The program and, per op id, ``(MLIR operation, inside_call)``: the operation the op
      was read from and whether it sits in an inlined callee (one MLIR operation then stands
      for several ops, one per call).
    """
    _load_ir()
    reader = _Reader(module, source)
    reader.trace = []
    return reader.program(), reader.trace


def _parse_error_line(source: str, err: Any) -> str:
    """One line ``source:line:col: message`` from an MLIR parse error."""
    for diagnostic in err.error_diagnostics:
        # Some messages go on with the op they are about, printed over many lines.
        lines = str(diagnostic.message).strip().splitlines() or [""]
        message = lines[0].strip().removesuffix(",").removesuffix(", has") + (" (...)" if len(lines) > 1 else "")
        try:
            location = ir.FileLineColLoc(diagnostic.location)
        except (TypeError, ValueError):
            return f"{source}: {message}"
        return f"{source}:{location.start_line}:{location.start_col}: {message}"
    return f"{source}: cannot parse StableHLO: {str(err).splitlines()[-1]}"


def python_location(location: Any) -> str:
    """``file:line`` of the innermost frame of the user's own code in an MLIR location, ``""`` if none.

    JAX writes ``NameLoc("jit(f)/dot_general", CallSiteLoc(callee, caller))`` chains, innermost frame
    first, with JAX's own frames left out; a library's frames (Flax, Equinox, Hugging Face: anything
    installed in site-packages) stay, so the first frame outside them is the user's line. Where every
    frame is a library's, the innermost.
    """
    _load_ir()
    innermost = ""
    pending = [location]
    while pending:
        loc = pending.pop()
        if isinstance(loc, ir.FileLineColLoc):
            filename = loc.filename
            if not _library_file(filename):
                return f"{filename}:{loc.start_line}"
            innermost = innermost or f"{filename}:{loc.start_line}"
        elif isinstance(loc, ir.NameLoc):
            pending.append(loc.child_loc)
        elif isinstance(loc, ir.CallSiteLoc):
            pending.extend((loc.caller, loc.callee))  # the callee (inner) is taken first
        elif isinstance(loc, ir.FusedLoc):
            pending.extend(reversed(list(loc.locations)))
    return innermost


_LIBRARY_DIRS = ("site-packages", "dist-packages")


_TOAST_DIR = str(Path(__file__).resolve().parent.parent)
_EXAMPLES_DIR = os.path.join(_TOAST_DIR, "examples")
# Python's own library, once: sysconfig.get_paths() expands its install scheme each call (0.1 ms; it was
# most of the time of reading a program whose locations carry tens of thousands of frames).
_STDLIB_DIR = sysconfig.get_paths()["stdlib"]


@functools.lru_cache(maxsize=4096)
def _library_file(path: str) -> bool:
    """Whether ``path`` is in an installed library, Python's own library or toast (which lowers the
    program: its bundled examples excepted), not the user's code."""
    parts = path.replace("\\", "/").split("/")
    if any(part in _LIBRARY_DIRS for part in parts):
        return True
    if path.startswith(_TOAST_DIR + os.sep) and not path.startswith(_EXAMPLES_DIR + os.sep):
        return True
    return path.startswith(_STDLIB_DIR + os.sep)


def _name_of_location(location: Any) -> str:
    """The name of a bare ``loc("x")`` (JAX's argument names), ``""`` otherwise."""
    if isinstance(location, ir.NameLoc) and isinstance(location.child_loc, ir.UnknownLoc):
        return location.name_str
    return ""


def _tensor_type(mlir_type: Any, *, what: str, where: str) -> tuple[tuple[int, ...], str, int]:
    """Static shape, element type and element bit width; non-tensor types (tokens, tuples) are
    rank 0 of width 0."""
    if not isinstance(mlir_type, ir.RankedTensorType):
        if isinstance(mlir_type, ir.ShapedType):  # unranked tensor
            raise InputError(f"{where}: {what} has unranked type {mlir_type}; toast needs static shapes")
        return (), "", 0
    if not mlir_type.has_static_shape:
        raise InputError(
            f"{where}: {what} has dynamic shape {mlir_type}; toast needs static shapes "
            "(lower with concrete sizes, e.g. jax.ShapeDtypeStruct)"
        )
    element_type = mlir_type.element_type
    dtype = str(element_type)
    bits = _BITS.get(dtype)
    if bits is None:
        bits = _BITS[dtype] = element_bits(element_type)
    return tuple(mlir_type.shape), dtype, bits


# Element type -> bits, filled as types are met (a program has a handful of element types).
_BITS: dict[str, int] = {}


def element_bits(element_type: Any) -> int:
    """Bits of one element as the MLIR type states them (a complex number is two of its
    parts); 0 for a type without a width (quantized, opaque)."""
    _load_ir()
    if isinstance(element_type, ir.ComplexType):
        return 2 * element_bits(element_type.element_type)
    if isinstance(element_type, (ir.IntegerType, ir.FloatType)):
        return int(element_type.width)
    return 0


def _integer_scalar(attr: Any) -> int | None:
    """The value of a rank-0 (or splat) integer constant, else ``None``: loop bounds and steps, which the
    cost model reads to count a ``stablehlo.while``'s iterations."""
    try:
        dense = ir.DenseIntElementsAttr(attr)
    except (TypeError, ValueError):
        return None
    if not dense.is_splat or ir.ShapedType(dense.type).rank != 0:
        return None
    return int(ir.IntegerAttr(dense.get_splat_value()).value)


def _splat(attr: Any) -> str | None:
    """The element every entry of a splat constant holds, as MLIR prints it with its type (``"0.000000e+00 :
    bf16"``), else ``None``: equal splats broadcast to equal shapes are one value to XLA's CSE."""
    try:
        dense = ir.DenseElementsAttr(attr)
    except (TypeError, ValueError):
        return None
    return str(dense.get_splat_value()) if dense.is_splat else None


def decode_attribute(attr: Any) -> Any:
    """An MLIR attribute as plain Python (ints, strings, tuples, dicts); ``None`` if opaque."""
    _load_ir()
    from jaxlib.mlir.dialects import stablehlo

    for cls in (ir.DenseI64ArrayAttr, ir.DenseBoolArrayAttr, ir.DenseI32ArrayAttr):
        if isinstance(attr, cls):
            return tuple(int(x) for x in attr)
    if isinstance(attr, ir.BoolAttr):
        return int(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.StringAttr):
        return attr.value
    if isinstance(attr, ir.FlatSymbolRefAttr):
        return attr.value
    if isinstance(attr, ir.DenseIntElementsAttr) and not isinstance(attr, ir.DenseResourceElementsAttr):
        # Rank 2: a convolution's or reduce_window's ``padding`` ([rank, 2] pairs), flattened row-major.
        if len(ir.ShapedType(attr.type).shape) <= 2:
            return tuple(int(attr[i]) for i in range(len(attr)))
        return None
    if stablehlo.ComparisonDirectionAttr.isinstance(attr):
        return str(stablehlo.ComparisonDirectionAttr(attr).value)  # "LT", "EQ", ...
    numbers = _DIMENSION_NUMBERS.get(type(attr).__name__)
    if numbers is None:
        for cls_name in _DIMENSION_NUMBERS:
            cls = getattr(stablehlo, cls_name)
            if cls.isinstance(attr):
                attr = cls(attr)
                numbers = _DIMENSION_NUMBERS[cls_name]
                break
    if numbers is not None:
        return {field: _plain(getattr(attr, field)) for field in numbers}
    return _tensor_sharding(attr)


def _tensor_sharding(attr: Any) -> dict[str, Any] | None:
    """A Shardy ``#sdy.sharding<@mesh, [{"batch"}, {"model", ?}]>`` as ``{"mesh": "mesh",
    "dims": (("batch",), ("model",)), "open": (0, 1)}`` (axes major to minor per dim, a
    sub-axis as ``"model:(1)2"``; ``mesh`` is ``""`` for an inline mesh); ``None`` for any
    other attribute."""
    from jaxlib.mlir.dialects import sdy

    if not sdy.TensorShardingAttr.isinstance(attr):
        return None
    sharding = sdy.TensorShardingAttr(attr)
    mesh = sharding.mesh_or_ref
    dims, open_dims = [], []
    for dim in sharding.dimension_shardings:
        dim = sdy.DimensionShardingAttr(dim)
        axes = []
        for axis in dim.axes:
            axis = sdy.AxisRefAttr(axis)
            sub = axis.sub_axis_info
            if sub is not None:
                sub = sdy.SubAxisInfoAttr(sub)
                axes.append(f"{axis.name}:({sub.pre_size}){sub.size}")
            else:
                axes.append(axis.name)
        dims.append(tuple(axes))
        open_dims.append(int(not dim.is_closed))
    return {"mesh": mesh.value if isinstance(mesh, ir.FlatSymbolRefAttr) else "",
            "dims": tuple(dims), "open": tuple(open_dims)}


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(int(x) for x in value)
    return int(value)


_DIMENSION_NUMBERS: dict[str, tuple[str, ...]] = {
    "DotDimensionNumbers": (
        "lhs_batching_dimensions",
        "rhs_batching_dimensions",
        "lhs_contracting_dimensions",
        "rhs_contracting_dimensions",
    ),
    "ConvDimensionNumbers": (
        "input_batch_dimension",
        "input_feature_dimension",
        "input_spatial_dimensions",
        "kernel_input_feature_dimension",
        "kernel_output_feature_dimension",
        "kernel_spatial_dimensions",
        "output_batch_dimension",
        "output_feature_dimension",
        "output_spatial_dimensions",
    ),
    "GatherDimensionNumbers": (
        "offset_dims",
        "collapsed_slice_dims",
        "operand_batching_dims",
        "start_indices_batching_dims",
        "start_index_map",
        "index_vector_dim",
    ),
    "ScatterDimensionNumbers": (
        "update_window_dims",
        "inserted_window_dims",
        "input_batching_dims",
        "scatter_indices_batching_dims",
        "scattered_dims_to_operand_dims",
        "index_vector_dim",
    ),
}

def kernel_attributes(attributes: Any, *, where: str) -> tuple[tuple[str, Any], ...]:
    """A custom call's kernel identity, as op attributes: ``("kernel", name)`` (the ``kernel_name`` attribute of
    a Pallas TPU kernel, else the ``name`` its backend_config gives: a Pallas GPU / Triton kernel) and, when its
    backend_config carries one, ``("kernel_cost_estimate", (flops, bytes, transcendentals))`` (a Pallas TPU
    kernel's ``custom_call_config.cost_estimate``: counts over the call's whole shapes), and
    ``("kernel_config", ((key, value), ...))``: the entries of a cuDNN fused attention call's
    ``cudnn_fmha_backend_config`` (its mask type, dot dimension numbers, ...: ``_flat_config``).

    Raises:
      InputError: a cost estimate whose counts are not non-negative integers.
    """
    config = _backend_config(attributes)
    found: list[tuple[str, Any]] = []
    name = decode_attribute(attributes["kernel_name"]) if "kernel_name" in attributes else None
    if not isinstance(name, str) or not name:
        name = config.get("name")
    if isinstance(name, str) and name:
        found.append(("kernel", name))
    call_config = config.get("custom_call_config")
    estimate = call_config.get("cost_estimate") if isinstance(call_config, dict) else None
    if estimate is not None:
        counts = tuple(estimate.get(key) if isinstance(estimate, dict) else None
                       for key in ("flops", "bytes_accessed", "transcendentals"))
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise InputError(f"{where}: custom_call cost_estimate {json.dumps(estimate)[:200]} is not a set of "
                             "non-negative integer counts (flops, bytes_accessed, transcendentals)")
        found.append(("kernel_cost_estimate", counts))
    fmha = config.get("cudnn_fmha_backend_config")
    if isinstance(fmha, dict):
        found.append(("kernel_config", _flat_config(fmha)))
    return tuple(found)


def _flat_config(config: dict[str, Any], prefix: str = "") -> tuple[tuple[str, str], ...]:
    """A JSON object's leaves as sorted ``(dotted key, text)`` pairs: ``{"a": {"b": [0, 2]}}`` is
    ``(("a.b", "0,2"),)``. A number is its JSON text whether the JSON wrote it as a number or a string (XLA's
    proto JSON writes 64-bit integers as strings), a list of scalars its items joined by commas; empty lists,
    lists of objects and text with control characters (no one Datalog symbol) are left out."""
    flat: list[tuple[str, str]] = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.extend(_flat_config(value, f"{path}."))
            continue
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(item, (str, int, float)) for item in items):
            continue
        text = ",".join(item if isinstance(item, str) else json.dumps(item) for item in items)
        if text.isprintable():
            flat.append((path, text))
    return tuple(sorted(flat))


# XLA's own placement custom calls (in HLO read back as StableHLO): the memory their result goes to.
_PLACEMENT_TARGETS = {"MoveToHost": "pinned_host", "MoveToDevice": "device"}


def memory_placement(attributes: Any) -> str:
    """The memory kind a custom call places its result in (``Value.memory_kind``): the ``_xla_buffer_placement``
    of its ``mhlo.frontend_attributes`` (JAX's ``annotate_device_placement``: ``jax.device_put`` to a memory
    space inside ``jit``, offloading remat policies), or ``"pinned_host"`` / ``"device"`` for XLA's ``MoveToHost``
    / ``MoveToDevice``; ``""`` for any other call."""
    frontend = attributes["mhlo.frontend_attributes"] if "mhlo.frontend_attributes" in attributes else None
    if isinstance(frontend, ir.DictAttr) and "_xla_buffer_placement" in frontend:
        placement = decode_attribute(frontend["_xla_buffer_placement"])
        if isinstance(placement, str):
            return placement
    target = decode_attribute(attributes["call_target_name"]) if "call_target_name" in attributes else None
    return _PLACEMENT_TARGETS.get(target, "") if isinstance(target, str) else ""


def _backend_config(attributes: Any) -> dict[str, Any]:
    """A custom call's backend_config as a dict: a JSON string (``backend_config``, as a Pallas TPU kernel has it) or
    a dictionary attribute (``mhlo.backend_config``, as a Triton kernel has it); ``{}`` when it is neither (an opaque
    string of another library: it names no kernel)."""
    for key in ("backend_config", "mhlo.backend_config"):
        if key not in attributes:
            continue
        attr = attributes[key]
        if isinstance(attr, ir.StringAttr):
            try:
                parsed = json.loads(attr.value) if attr.value.strip() else None
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                return parsed
        elif isinstance(attr, ir.DictAttr):
            # Only the name: other entries can be large or binary (a Triton kernel's ``ir``).
            return {"name": decode_attribute(attr["name"])} if "name" in attr else {}
    return {}


# Attributes that only carry data the rules never read (and can be large).
_SKIPPED_ATTRIBUTES = frozenset({"value", "backend_config", "mhlo.frontend_attributes", "precision_config"})


class _Reader:
    """Walks the entry function, inlining private functions, and numbers values and ops.

    Each function's operations are fetched once, in pre-order, by one ``Operation.walk`` (plain ``Operation``
    objects: iterating blocks builds an OpView subclass per op, twice the bindings' time); the reader then
    consumes that list in order, an op's regions' ops right after it (``_walk``), and each inlined call reads
    its callee's list again.
    """

    def __init__(self, module: Any, source: str) -> None:
        self.source = source
        self.module = module
        self.functions: dict[str, Any] = {}
        for op in module.body.operations:
            if op.operation.name == "func.func":
                self.functions[op.attributes["sym_name"].value] = op
        self.values: list[Value] = []
        self.ops: list[Op] = []
        self.call_counts: dict[str, int] = {}
        self.trace: list[tuple[Any, bool]] | None = None
        # MLIR uniques attributes and locations in its context: a 100k-op program has tens of thousands of ops
        # but a few hundred distinct ones of each, so each is decoded once (keyed by the attribute; a location by
        # its attribute: Location objects hash by identity).
        self._decoded: dict[Any, Any] = {}
        self._constants: dict[Any, tuple[tuple[str, Any], ...]] = {}
        self._locations: dict[Any, str] = {}
        self._types: dict[Any, tuple[tuple[int, ...], str, int]] = {}
        # function name -> its body's operations in pre-order (``_operations``), walked once however often called.
        self._bodies: dict[str, list[Any]] = {}

    def program(self, *, text: str = "") -> Program:
        entry = self._entry_function()
        block = entry.regions[0].blocks[0]
        names = ir.AsmState(entry)
        env: dict[Any, int] = {}
        arguments = []
        arg_attrs = entry.attributes["arg_attrs"] if "arg_attrs" in entry.attributes else None
        for index, arg in enumerate(block.arguments):
            name = _name_of_location(arg.location) or arg.get_name(names)
            value = self._new_value(arg, name=name, loc="", what=f"argument {name}")
            attrs = arg_attrs[index] if arg_attrs is not None and index < len(arg_attrs) else None
            if attrs is not None and "mhlo.memory_kind" in attrs:  # jit's in_shardings with a memory kind
                kind = decode_attribute(attrs["mhlo.memory_kind"])
                if isinstance(kind, str):
                    self.values[value] = dataclasses.replace(self.values[value], memory_kind=kind)
            env[arg] = value
            arguments.append(value)
        body = self._operations(entry)
        self._walk(body, 1, len(block.operations), env, names, "", None, 0, "")
        terminator = self.ops[-1]
        results = terminator.operands
        self._name_results(entry, results, set(arguments))
        module_attributes = self.module.operation.attributes
        has_name = "sym_name" in module_attributes
        return Program(
            name=module_attributes["sym_name"].value if has_name else Path(self.source).stem,
            values=tuple(self.values),
            ops=tuple(self.ops),
            arguments=tuple(arguments),
            results=tuple(results),
            text=text,
        )

    def _entry_function(self) -> Any:
        return entry_function(self.functions, self.source)

    def _operations(self, function: Any) -> list[Any]:
        """``function`` and every operation inside it, nested ones included, in pre-order (an op, then its
        regions' ops in order): ``[function, op, op's first nested op, ...]``."""
        operations: list[Any] = []
        append = operations.append
        advance = ir.WalkResult.ADVANCE

        def collect(operation: Any) -> Any:
            append(operation)
            return advance

        function.operation.walk(collect, ir.WalkOrder.PRE_ORDER)
        return operations

    def _name_results(self, entry: Any, results: tuple[int, ...], arguments: set[int]) -> None:
        """Give returned values the entry function's ``jax.result_info`` names."""
        labels: list[str] = []
        res_attrs = entry.attributes["res_attrs"] if "res_attrs" in entry.attributes else None
        for index in range(len(results)):
            label = f"result[{index}]"
            if res_attrs is not None:
                attrs = res_attrs[index]
                if "jax.result_info" in attrs:
                    info = attrs["jax.result_info"].value
                    label = info if info.startswith("result") else f"result{info}" if info else label
            labels.append(label)
        named: set[int] = set()
        for value_id, label in zip(results, labels, strict=True):
            if value_id in arguments or value_id in named:
                continue
            named.add(value_id)
            old = self.values[value_id]
            self.values[value_id] = dataclasses.replace(old, name=label)

    def _new_value(self, mlir_value: Any, *, name: str, loc: str, what: str) -> int:
        typed = self._type(mlir_value.type, what=what, where=loc)
        value = Value(len(self.values), name, *typed, loc)
        self.values.append(value)
        return value.id

    def _type(self, mlir_type: Any, *, what: str, where: str) -> tuple[tuple[int, ...], str, int]:
        """``_tensor_type`` of ``mlir_type``, once per distinct type (types are uniqued too); a dynamic shape
        fails here, where first met."""
        typed = self._types.get(mlir_type)
        if typed is None:
            typed = self._types[mlir_type] = _tensor_type(mlir_type, what=what, where=where or self.source)
        return typed

    def _walk(self, operations: list[Any], index: int, count: int, env: dict[Any, int], names: Any, prefix: str,
              parent: tuple[int, int] | None, depth: int, call_loc: str) -> int:
        """Read the ``count`` ops of one block, which start at ``operations[index]`` (a pre-order list,
        ``_operations``), each with the ops of its regions; the index after the last of them."""
        values, ops, types, locations, trace = self.values, self.ops, self._types, self._locations, self.trace
        make_value, make_op = _MAKE_VALUE, _MAKE_OP
        for _ in range(count):
            mlir_op = operations[index]
            index += 1
            kind = mlir_op.name
            location = mlir_op.location
            key = location.attr
            user_loc = locations.get(key)
            if user_loc is None:
                user_loc = locations[key] = python_location(location)
            # Ops of private functions (relu, log_softmax) carry no user frame: use the call's.
            loc = user_loc or call_loc
            try:
                operands = tuple(map(env.__getitem__, mlir_op.operands))
            except KeyError:  # pragma: no cover - MLIR verifies dominance before we get here
                raise InputError(f"{loc or self.source}: {kind} uses a value defined outside its scope") from None
            results = []
            for mlir_result in mlir_op.results:
                name = prefix + mlir_result.get_name(names)
                mlir_type = mlir_result.type
                typed = types.get(mlir_type)
                if typed is None:
                    typed = self._type(mlir_type, what=f"{kind} result {name}", where=loc)
                value_id = len(values)
                values.append(make_value(value_id, name, *typed, loc, ""))
                env[mlir_result] = value_id
                results.append(value_id)
            result_ids = tuple(results)
            op_id = len(ops)
            attributes = mlir_op.attributes
            attrs = self._attributes(kind, attributes) if len(attributes) else ()
            if kind == "stablehlo.custom_call":
                attrs = tuple(sorted(attrs + kernel_attributes(attributes, where=loc or self.source),
                                     key=_FIRST))
                placed = memory_placement(attributes)
                for value_id in result_ids if placed else ():
                    values[value_id] = dataclasses.replace(values[value_id], memory_kind=placed)
            # Reserve the op's slot first so parents precede their children.
            ops.append(make_op(op_id, kind, operands, result_ids, attrs, loc, parent, ()))
            if trace is not None:
                trace.append((mlir_op, depth > 0))
            regions: tuple[tuple[int, ...], ...]
            if kind == "func.call":
                regions = (self._inline_call(mlir_op, op_id, loc=loc, depth=depth),)
            elif len(mlir_op.regions):
                regions, index = self._regions(mlir_op, kind, op_id, operations, index, env, names, prefix, loc,
                                               depth, call_loc)
            else:  # most ops: the reserved op is the op
                continue
            ops[op_id] = make_op(op_id, kind, operands, result_ids, attrs, loc, parent, regions)
        return index

    def _regions(self, mlir_op: Any, kind: str, op_id: int, operations: list[Any], index: int,
                 env: dict[Any, int], names: Any, prefix: str, loc: str, depth: int,
                 call_loc: str) -> tuple[tuple[tuple[int, ...], ...], int]:
        """Read the regions of ``mlir_op`` (op ``op_id``), whose ops start at ``operations[index]``: each
        region's block arguments, and the index after its last nested op."""
        regions: list[tuple[int, ...]] = []
        for region_index, region in enumerate(mlir_op.regions):
            blocks = region.blocks
            if not len(blocks):
                regions.append(())
                continue
            if len(blocks) > 1:
                raise InputError(f"{loc or self.source}: {kind} has a region with several blocks; "
                                 "toast reads structured StableHLO only")
            block = blocks[0]
            args = tuple(
                self._new_value(a, name=prefix + a.get_name(names), loc=loc, what=f"block argument of {kind}")
                for a in block.arguments
            )
            for mlir_arg, value_id in zip(block.arguments, args, strict=True):
                env[mlir_arg] = value_id
            regions.append(args)
            index = self._walk(operations, index, len(block.operations), env, names, prefix, (op_id, region_index),
                               depth, call_loc)
        return tuple(regions), index

    def _inline_call(self, mlir_op: Any, op_id: int, *, loc: str, depth: int) -> tuple[int, ...]:
        """Walk a fresh copy of the callee's body inside region 0 of the call op."""
        callee_name = mlir_op.attributes["callee"].value
        callee = self.functions.get(callee_name)
        if callee is None:
            raise InputError(f"{loc or self.source}: func.call of unknown function @{callee_name}")
        if depth >= _MAX_INLINE_DEPTH:
            raise InputError(f"{loc or self.source}: calls nested deeper than {_MAX_INLINE_DEPTH} (recursion?) "
                             f"at @{callee_name}")
        count = self.call_counts.get(callee_name, 0)
        self.call_counts[callee_name] = count + 1
        prefix = f"@{callee_name}#{count}:"
        block = callee.regions[0].blocks[0]
        names = ir.AsmState(callee)
        callee_env: dict[Any, int] = {}
        args = tuple(
            self._new_value(a, name=prefix + a.get_name(names), loc=loc, what=f"argument of @{callee_name}")
            for a in block.arguments
        )
        for mlir_arg, value_id in zip(block.arguments, args, strict=True):
            callee_env[mlir_arg] = value_id
        body = self._bodies.get(callee_name)
        if body is None:
            body = self._bodies[callee_name] = self._operations(callee)
        self._walk(body, 1, len(block.operations), callee_env, names, prefix, (op_id, 0), depth + 1, loc)
        return args

    def _attributes(self, kind: str, attributes: Any) -> tuple[tuple[str, Any], ...]:
        """The decoded attributes of an op of kind ``kind`` (``attributes``: its MLIR attributes), sorted by name."""
        decoded = []
        known = self._decoded
        for name in attributes:
            name = getattr(name, "name", name)  # older bindings yield NamedAttribute
            if name in _SKIPPED_ATTRIBUTES:
                continue
            attr = attributes[name]
            value = known.get(attr, _MISSING)
            if value is _MISSING:
                value = known[attr] = decode_attribute(attr)
            if value is not None:
                decoded.append((name, value))
        if kind == "stablehlo.constant" and "value" in attributes:
            attr = attributes["value"]
            constant = self._constants.get(attr)
            if constant is None:
                scalar, splat = _integer_scalar(attr), _splat(attr)
                constant = self._constants[attr] = (
                    (("scalar", scalar),) if scalar is not None else ()) + (
                    (("splat", splat),) if splat is not None else ())
            decoded += constant
        if len(decoded) > 1:
            decoded.sort(key=_FIRST)
        return tuple(decoded)


_FIRST = operator.itemgetter(0)
# ``Value(...)`` and ``Op(...)`` with every field given, in half the time (``toast.frozen.constructor``).
_MAKE_VALUE, _MAKE_OP = constructor(Value), constructor(Op)
_MISSING = object()
