"""Fuzzing the readers a user feeds (issue 11): generators of mutated inputs and the property
every input must satisfy. Shared by ``tests/test_fuzz.py`` (a bounded slice in the default run)
and ``benchmarks/bench_fuzz.py`` (the long run).

Readers and their seeds:

- ``stablehlo``: StableHLO text of small real programs (``mlp``, ``transpose_matmul``, a tiny
  ``scan``), mutated line- and character-wise (delete, duplicate, swap lines; flip characters;
  other numbers in shapes and attributes; MLIR tokens inserted; truncation);
- ``bytecode``: their MLIR bytecode and a StableHLO portable artifact, mutated byte-wise;
- ``strategy``: a real ``toast shard`` strategy file, mutated as JSON (keys deleted, values
  replaced by arbitrary JSON, types swapped) and as text;
- ``hardware``: the bundled ``hardware/*.toml`` profiles, mutated as TOML values and as text;
- ``rules``: the package's ``rules/**/*.dl`` files, mutated as text (Datalog and preprocessor
  tokens inserted, lines moved, numbers changed) and given as a ``--rules`` override or as an
  extra user file.

The property: each input ends in a result or in one ``toast: error:`` line with exit status 2
(``ToastError`` with a one-line message for direct calls); never another exception, never
longer than ``HANG_S``, never a file left behind. Every reader is called directly for every
input (cheap) and through ``toast.cli.main`` for the inputs whose command line run is cheap
(refused before the analysis) and for a sample of the others.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from toast.errors import ToastError

HANG_S = 20.0  # an input taking longer than this (direct call or command line) is a hang
# A bytecode mutant the reader works on longer counts as one read_file refuses (its child times out).
WORKER_TIMEOUT_S = 10.0
READERS = ("stablehlo", "bytecode", "strategy", "hardware", "rules")


# ---------------------------------------------------------------------------------------------
# Outcomes
# ---------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What one reader's inputs came to."""

    tried: int = 0
    accepted: int = 0
    refused: int = 0
    cli_runs: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    distinct: set[int] = field(default_factory=set)


class Failure(Exception):
    """An input broke the property (traceback, hang, stray file, malformed error)."""


def _one_line_error(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, ToastError) and bool(text) and "\n" not in text


def direct(call: Callable[[], Any], what: str) -> bool:
    """Run a reader directly: ``True`` when it returned, ``False`` when it refused with a
    one-line ``ToastError``; raises ``Failure`` otherwise."""
    start = time.monotonic()
    try:
        call()
        accepted = True
    except ToastError as err:
        if not _one_line_error(err):
            raise Failure(f"{what}: ToastError with a message of {len(str(err).splitlines())} lines: {err!r}") from None
        accepted = False
    except Exception:
        raise Failure(f"{what}: traceback\n{traceback.format_exc()}") from None
    if time.monotonic() - start > HANG_S:
        raise Failure(f"{what}: took {time.monotonic() - start:.1f} s")
    return accepted


def _files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*")}


def cli(argv: Sequence[str], cwd: Path, outputs: Sequence[Path], *,
        check_output: Callable[[Path], None] | None = None) -> int:
    """Run ``toast`` in-process in ``cwd``; check exit status, stderr and files. Returns the exit
    status (0 or 2); raises ``Failure`` otherwise."""
    from toast.cli import main

    before = _files(cwd)
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(list(argv))
    except KeyboardInterrupt:
        raise
    except BaseException:
        raise Failure(f"toast {' '.join(argv)}: traceback\n{traceback.format_exc()}") from None
    finally:
        os.chdir(previous)
    elapsed = time.monotonic() - start
    where = f"toast {' '.join(argv)}"
    if elapsed > HANG_S + 5:
        raise Failure(f"{where}: took {elapsed:.1f} s")
    lines = [line for line in err.getvalue().splitlines() if not line.startswith("toast: compiling")]
    after = _files(cwd)
    new = after - before - {p.relative_to(cwd).as_posix() for p in outputs if status == 0}
    if status == 2:
        if len(lines) != 1 or not lines[0].startswith("toast: error: "):
            raise Failure(f"{where}: exit 2 with stderr {lines!r}")
    elif status == 0:
        if lines:
            raise Failure(f"{where}: exit 0 with stderr {lines!r}")
        missing = [str(p) for p in outputs if not p.exists()]
        if missing:
            raise Failure(f"{where}: exit 0 without {missing}")
        if check_output is not None:
            for path in outputs:
                check_output(path)
    else:
        raise Failure(f"{where}: exit status {status}, stderr {lines!r}")
    if new:
        raise Failure(f"{where}: exit {status} left {sorted(new)}")
    return status


# ---------------------------------------------------------------------------------------------
# Seeds (computed once per process)
# ---------------------------------------------------------------------------------------------


def _tiny_scan() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import jax
    import jax.numpy as jnp

    def body(carry, w):
        return jnp.tanh(carry @ w), carry.sum()

    def scan(x, ws):
        return jax.lax.scan(body, x, ws)

    return scan, (jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((3, 8, 8), jnp.float32))


@functools.cache
def stablehlo_texts() -> tuple[str, ...]:
    from toast.examples.mlp import mlp
    from toast.examples.transpose_matmul import transpose_matmul
    from toast.frontend.stablehlo import lower_callable

    return tuple(lower_callable(*factory()) for factory in (mlp, transpose_matmul, _tiny_scan))


@functools.cache
def bytecodes() -> tuple[bytes, ...]:
    from jax.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    found = []
    for text in stablehlo_texts():
        buffer = io.BytesIO()
        ir.Module.parse(text, context=jax_mlir.make_ir_context()).operation.write_bytecode(buffer)
        found.append(buffer.getvalue())
    version = stablehlo.get_current_version()
    found.append(bytes(stablehlo.serialize_portable_artifact_str(stablehlo_texts()[0], version)))
    return tuple(found)


@functools.cache
def strategy_document() -> dict[str, Any]:
    """``toast shard toast.examples.mlp:mlp --mesh batch=4,model=2 -o s.json``."""
    from toast.cli import main

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "s.json"
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["shard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--engine", "embedded",
                         "-o", str(path)]) == 0
        return dict(json.loads(path.read_text()))


@functools.cache
def hardware_texts() -> tuple[str, ...]:
    from toast.resources import resource_dir

    return tuple(p.read_text() for p in sorted(resource_dir("hardware").glob("*.toml")))


@functools.cache
def rule_texts() -> tuple[tuple[str, str], ...]:
    """``(path relative to rules/, text)`` of every rule file of the default variant."""
    from toast.datalog.variants import load_variant
    from toast.resources import resource_dir

    variant = load_variant()
    return tuple((r, (resource_dir("rules") / r).read_text()) for r in variant.rules + variant.conflict_rules)


@functools.cache
def mlp_analysis() -> Any:
    from toast.analysis.named_dimensions import analyze

    return analyze("toast.examples.mlp:mlp", engine="embedded")


@functools.cache
def sharding_model(axes: tuple[tuple[str, int], ...]) -> Any:
    from toast.sharding.mesh import parse_mesh
    from toast.sharding.state import ShardingModel

    return ShardingModel(mlp_analysis(), parse_mesh(",".join(f"{a}={n}" for a, n in axes)))


@functools.cache
def mlp_megatron() -> tuple[Any, Any, Any]:
    """``(model, state, actions)`` of megatron on mlp over ``batch=4,model=2``."""
    from toast.sharding.roles import roles_for_input
    from toast.sharding.strategies import manual_strategy

    model = sharding_model((("batch", 4), ("model", 2)))
    state, actions = manual_strategy(model, "megatron", roles_for_input("toast.examples.mlp:mlp"))
    return model, state, actions


# ---------------------------------------------------------------------------------------------
# Mutations
# ---------------------------------------------------------------------------------------------

INTERESTING_NUMBERS = ("0", "-1", "1", "2", "3", "7", "8", "255", "256", "65536", "2147483647", "2147483648",
                       "4294967296", "9223372036854775808", "-2147483649", "1e308", "1e-320", "0x7f", "00", "1.5")
MLIR_TOKENS = ("%", "%0", "%arg0", "@main", "@relu", "(", ")", "{", "}", "<", ">", "[", "]", ":", ",", "=", "->", "x",
               "?", "tensor<", "tensor<?x4xf32>", "tensor<*xf32>", "f32", "i1", "!stablehlo.token", "loc(", "#loc",
               "\"",
               "\\FF", "\\", "dense<", "stablehlo.add", "stablehlo.while", "func.call", "call @main", "return", "^bb1:",
               "dims = [", "contracting_dims = [5] x [0]", "#sdy.sharding<@mesh, [{\"x\"}]>",
               "sdy.mesh @mesh = <[\"x\"=2]>",
               "{-#", "#-}", "\n", "//", "\u00e9", "\x00")
DATALOG_TOKENS = (":-", ".", ",", ";", "!", "(", ")", "_", "\"", "\"\\", "=", "!=", "<", "+", "-", "*", "/", "%", "^",
                  "$",
                  ".decl r(x:number)", ".decl ", ".input ", ".output ", ".type T <: symbol", ".type U = T | V",
                  ".plan 1:(1,2)", ".pragma \"x\"", "number", "symbol", "unsigned", "float", "count : { }",
                  "#include \"nda.dl\"", "#include \"nope.dl\"", "#include \"/dev/null\"", "#define X(a) a",
                  "#define Y", "#ifdef Y", "#ifndef Y", "#else", "#endif", "#undef Y", "#if 1", "#error", "#line 1",
                  "__FILE__", "__LINE__", "/*", "*/", "//", "\n", "0x", "0b", "2147483648", "4294967296", "-2147483648",
                  "1.5", "nil", "as(x, T)", "cat(a, b)", "band", "lnot", "\u00e9", "\x00", "\\")
TOML_TOKENS = ("=", "[", "]", "[[", "]]", "{", "}", "\"", "'", "\"\"\"", ",", ".", "#", "\n", "inf", "-inf", "nan",
               "true", "1979-05-27", "0x10", "1_000", "1e999", "-0.0", "\\u0000", "\\", "[compute]", "[[interconnect]]",
               "[memory]", "sources = []", "devices = 0", "bandwidth = -1", "name = 3", "\u00e9", "\x00")

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


@st.composite
def _text_edits(draw: st.DrawFn, base: str, tokens: Sequence[str]) -> str:
    """``base`` after one to four random edits."""
    text = base
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("delete_line", "duplicate_line", "swap_lines", "char", "number", "token",
                                     "delete_span", "truncate")))
        lines = text.split("\n")
        position = draw(st.integers(0, 10**9))
        if kind in ("delete_line", "duplicate_line", "swap_lines") and lines:
            i = position % len(lines)
            if kind == "delete_line":
                del lines[i]
            elif kind == "duplicate_line":
                lines.insert(i, lines[i])
            else:
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif kind == "number":
            numbers = list(_NUMBER.finditer(text))
            if numbers:
                found = numbers[position % len(numbers)]
                text = text[:found.start()] + draw(st.sampled_from(INTERESTING_NUMBERS)) + text[found.end():]
        elif kind == "char" and text:
            i = position % len(text)
            text = text[:i] + draw(st.characters(codec="utf-8")) + text[i + 1:]
        elif kind == "token":
            i = position % (len(text) + 1)
            text = text[:i] + draw(st.sampled_from(tokens)) + text[i:]
        elif kind == "delete_span" and text:
            i = position % len(text)
            text = text[:i] + text[i + draw(st.integers(1, 200)):]
        elif kind == "truncate":
            text = text[:position % (len(text) + 1)]
    return text


@st.composite
def stablehlo_inputs(draw: st.DrawFn) -> str:
    return draw(_text_edits(draw(st.sampled_from(stablehlo_texts())), MLIR_TOKENS))


@st.composite
def bytecode_inputs(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(bytecodes())))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("flip", "set", "insert", "delete", "truncate", "int")))
        i = draw(st.integers(4, 10**9)) % max(len(data), 5)
        if kind == "flip" and i < len(data):
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and i < len(data):
            data[i] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[i:i + draw(st.integers(1, 32))]
        elif kind == "truncate":
            del data[i:]
        elif kind == "int":
            data[i:i + 4] = draw(st.sampled_from((b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x00",
                                                   b"\xff\xff\xff\x0f", b"\x80\x80\x80\x80")))
    return bytes(data)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats() | st.text(max_size=12)
    | st.sampled_from(("batch", "model", "a100_80gb", "h100", "x", "", "../hardware/h100.toml", "tpu_v4")),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8,
)


@st.composite
def _value_edits(draw: st.DrawFn, document: Any) -> Any:
    """``document`` (JSON-like) with one to four values deleted, replaced or retyped."""
    document = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, 4))):
        # Walk down to a random container.
        parent: Any = None
        key: Any = None
        node = document
        while isinstance(node, (dict, list)) and node and (parent is None or draw(st.integers(0, 3)) > 0):
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            parent, key = node, draw(st.sampled_from(keys))
            node = node[key]
        if parent is None:
            continue
        kind = draw(st.sampled_from(("delete", "replace", "retype", "duplicate", "empty")))
        if kind == "delete":
            del parent[key]
        elif kind == "replace":
            parent[key] = draw(JSON_VALUES)
        elif kind == "retype":
            value = parent[key]
            parent[key] = (str(value) if not isinstance(value, str) else
                           [value] if draw(st.booleans()) else (int(value) if value.isdigit() else None))
        elif kind == "duplicate" and isinstance(parent, list):
            parent.insert(key, parent[key])
        elif kind == "empty":
            parent[key] = type(parent[key])() if isinstance(parent[key], (dict, list, str)) else 0
    return document


@st.composite
def strategy_inputs(draw: st.DrawFn) -> str:
    document = draw(_value_edits(strategy_document()))
    text = json.dumps(document, indent=1)
    if draw(st.integers(0, 9)) == 0:
        tokens = ("{", "}", "[", "]", ",", ":", "\"", "NaN", "Infinity", "-0", "1e999", "\\u", "\n")
        text = draw(_text_edits(text, tokens))
    return text


def toml_text(document: dict[str, Any]) -> str:
    """A TOML document with every value written inline (``key = {...}``)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return ("nan" if math.isnan(v) else "inf" if v > 0 else "-inf") if not math.isfinite(v) else repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v if x is not None) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items() if x is not None) + "}"
        return "\"\""

    return "".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in document.items() if v is not None)


@st.composite
def hardware_inputs(draw: st.DrawFn) -> str:
    base = draw(st.sampled_from(hardware_texts()))
    if draw(st.booleans()):
        return draw(_text_edits(base, TOML_TOKENS))
    return toml_text(draw(_value_edits(tomllib.loads(base))))


@st.composite
def rules_inputs(draw: st.DrawFn) -> tuple[str, str]:
    """``(path under the --rules directory, text)``: a package rule file mutated, as an override
    (same path) or as an extra user file."""
    relative, base = draw(st.sampled_from(rule_texts()))
    text = draw(_text_edits(base, DATALOG_TOKENS))
    if draw(st.integers(0, 3)) == 0:
        relative = "conflicts/user.dl" if relative.startswith("conflicts/") else "user.dl"
    return relative, text


STRATEGIES: dict[str, Any] = {"stablehlo": stablehlo_inputs, "bytecode": bytecode_inputs, "strategy": strategy_inputs,
                              "hardware": hardware_inputs, "rules": rules_inputs}


# ---------------------------------------------------------------------------------------------
# Checks: one per reader; each returns True (accepted) or False (refused), or raises Failure
# ---------------------------------------------------------------------------------------------


@dataclass
class Sampler:
    """Which accepted inputs also go through the (slow) command line: every ``every``-th."""

    every: int
    seen: int = 0

    def __call__(self) -> bool:
        self.seen += 1
        return self.every > 0 and self.seen % self.every == 0


def _strict_json(path: Path) -> None:
    def refuse(constant: str) -> None:
        raise Failure(f"{path.name}: JSON with {constant}")

    json.loads(path.read_text(), parse_constant=refuse)


def check_stablehlo(text: str, directory: Path, sample: Sampler) -> tuple[bool, bool]:
    """``(accepted, ran the command line)``."""
    from toast.frontend.stablehlo import read_file

    path = directory / "input.mlir"
    path.write_text(text)
    accepted = direct(lambda: read_file(path), "read_file")
    if accepted and not sample():
        return True, False
    out = directory / "out.json"
    status = cli(["analyze", str(path), "--engine", "embedded", "--timeout", str(HANG_S), "--json", str(out)],
                 directory, [out], check_output=_strict_json)
    return status == 0, True


def check_bytecode_cli(data: bytes, directory: Path) -> bool:
    path = directory / "input.mlir"
    path.write_bytes(data)
    out = directory / "out.json"
    return cli(["analyze", str(path), "--engine", "embedded", "--timeout", str(HANG_S), "--json", str(out)],
               directory, [out], check_output=_strict_json) == 0


class BytecodeWorker:
    """Reads bytecode mutants as ``read_file`` does, in the child process's code
    (``_bytecode_text_here``, then ``read_text``), in one long-lived process per batch: a crash
    of that code is contained by ``read_file``'s child process and counts as a refusal."""

    SCRIPT = r"""
import sys, traceback
from toast.errors import ToastError
from toast.frontend.stablehlo import _bytecode_text_here, read_text
for line in sys.stdin:
    path = line.rstrip("\n")
    try:
        text = _bytecode_text_here(open(path, "rb").read(), source=path)
        read_text(text, source=path)
        print("ok", flush=True)
    except ToastError as err:
        print("refused" if str(err) and "\n" not in str(err) else "failure " + repr(str(err)), flush=True)
    except Exception:
        print("failure " + repr(traceback.format_exc()), flush=True)
"""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None
        self.crashes = 0
        self.crashed: list[bytes] = []

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1")
        return subprocess.Popen([sys.executable, "-c", self.SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env)

    def read(self, path: Path) -> bool:
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        assert self.process.stdin is not None and self.process.stdout is not None
        import select

        try:
            self.process.stdin.write(f"{path}\n")
            self.process.stdin.flush()
            ready, _, _ = select.select([self.process.stdout], [], [], WORKER_TIMEOUT_S)
            answer = self.process.stdout.readline().strip() if ready else ""
        except BrokenPipeError:
            answer = ""
        if not answer:  # the reader crashed or hung: read_file's child would be refused
            self.crashes += 1
            self.process.kill()
            self.process.wait()
            self.process = None
            self.crashed.append(path.read_bytes())
            return False
        if answer.startswith("failure"):
            raise Failure(f"bytecode reader: {answer}")
        return answer == "ok"

    def close(self) -> None:
        if self.process is not None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait()
            self.process = None


def check_bytecode(data: bytes, directory: Path, worker: BytecodeWorker, cli_too: bool) -> tuple[bool, bool]:
    path = directory / "input.mlir"
    path.write_bytes(data)
    accepted = worker.read(path)
    if cli_too:
        path.unlink()
        return check_bytecode_cli(data, directory), True
    return accepted, False


def check_strategy(text: str, directory: Path, sample: Sampler) -> tuple[bool, bool]:
    from toast.cost.hardware import load_hardware
    from toast.output.strategy_file import read_strategy_document, strategy_mesh, strategy_state

    path = directory / "s.json"
    path.write_text(text)
    stage = ["read"]

    def read() -> None:
        document = read_strategy_document(path)
        mesh = strategy_mesh(document, path=path)
        if mesh.devices != 8:
            raise ToastError("devices")  # as `--devices 8` refuses it
        load_hardware(str(document["hardware"]))
        stage[0] = "state"
        strategy_state(sharding_model(tuple(mesh.axes)), document, path=path)

    accepted = direct(read, "read_strategy_document/strategy_state")
    # The command line refuses cheaply before the analysis; after it, sample; an accepted file
    # would run XLA (seconds), which the direct call stands for.
    if accepted or (stage[0] == "state" and not sample()):
        return accepted, False
    out = directory / "agreement.json"
    cli(["validate", "toast.examples.mlp:mlp", str(path), "--devices", "8", "--engine", "embedded", "--timeout",
         str(HANG_S), "--json", str(out)], directory, [out])
    return accepted, True


def check_hardware(text: str, directory: Path, sample: Sampler) -> tuple[bool, bool]:
    from toast.cost.hardware import load_hardware
    from toast.cost.model import CostModel
    from toast.cost.network import axis_spans
    from toast.output.files import json_text
    from toast.output.strategy_file import read_strategy_document, strategy_json

    path = directory / "profile.toml"
    path.write_text(text)

    def use() -> None:
        hardware = load_hardware(str(path))
        axis_spans([("batch", 4), ("model", 2)], hardware)
        for dtype in ("bf16", "f32", "f64", "f16", "f8E4M3FN", "i8", "i32", "complex<f32>"):
            hardware.flops(dtype)
        model, state, actions = mlp_megatron()
        cost = CostModel(model, hardware).evaluate(state)
        document = strategy_json(model, state, actions, cost, source="toast.examples.mlp:mlp", hardware=hardware,
                                 name="megatron")
        written = directory / "written.json"
        written.write_text(json_text(document))
        try:
            _strict_json(written)
            read_strategy_document(written)  # what `toast shard -o` writes, `toast validate` reads
        except (Failure, ToastError) as err:
            raise Failure(f"toast shard --hardware {path.name} writes a strategy file its reader refuses: "
                          f"{err}") from None
        finally:
            written.unlink()

    accepted = direct(use, "load_hardware + cost")
    if accepted and not sample():
        return True, False
    out = directory / "s.json"
    status = cli(["shard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--hardware", str(path), "--engine",
                  "embedded", "--strategy", "megatron", "--timeout", str(HANG_S), "-o", str(out)], directory, [out],
                 check_output=_strict_json)
    return status == 0, True


def check_rules(entry: tuple[str, str], directory: Path, sample: Sampler, refused_sample: Sampler) -> tuple[bool, bool]:
    from toast.datalog.parser import parse_text
    from toast.datalog.variants import assemble, load_variant
    from toast.facts.schema import CONFLICTS, NDA

    relative, text = entry
    rules = directory / "rules"
    (rules / relative).parent.mkdir(parents=True, exist_ok=True)
    (rules / relative).write_text(text)
    stage = CONFLICTS if relative.startswith("conflicts/") else NDA

    def parse() -> None:
        assembled = assemble(load_variant(), user_rules=rules, stage=stage)
        parse_text(assembled.text, path=directory / "program.dl")

    accepted = direct(parse, "assemble + parse_text")
    if not (sample() if accepted else refused_sample()):
        return accepted, False
    out = directory / "out.json"
    status = cli(["analyze", "toast.examples.mlp:mlp", "--engine", "embedded", "--rules", str(rules), "--timeout",
                  str(HANG_S), "--json", str(out)], directory, [out], check_output=_strict_json)
    return status == 0, True


# ---------------------------------------------------------------------------------------------
# Running a reader's inputs
# ---------------------------------------------------------------------------------------------


class Fuzzer:
    """Runs the check of one reader on each input in a fresh directory (also the temporary
    directory toast's engines use), counts outcomes and keeps failing inputs."""

    def __init__(self, reader: str, *, cli_every: int, save_dir: Path | None = None) -> None:
        self.reader = reader
        self.tally = Tally()
        self.sample = Sampler(cli_every)
        self.refused_sample = Sampler(max(1, cli_every // 4) if cli_every else 0)
        self.save_dir = save_dir
        self.worker = BytecodeWorker() if reader == "bytecode" else None

    def __call__(self, case: Any) -> None:
        tally = self.tally
        tally.tried += 1
        tally.distinct.add(hash(case))
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="toast-fuzz-") as name:
            directory = Path(name)
            work = directory / "case"
            temporary = directory / "tmp"
            work.mkdir()
            temporary.mkdir()
            saved_tempdir = tempfile.tempdir
            tempfile.tempdir = str(temporary)
            try:
                accepted, ran_cli = self._check(case, work)
                if any(temporary.iterdir()):
                    raise Failure(f"left temporary files {sorted(p.name for p in temporary.iterdir())}")
                tally.accepted += accepted
                tally.refused += not accepted
                tally.cli_runs += ran_cli
            except Failure as failure:
                tally.failures.append(str(failure))
                self._save(case, str(failure))
            finally:
                tempfile.tempdir = saved_tempdir
        tally.seconds += time.monotonic() - start

    def _check(self, case: Any, work: Path) -> tuple[bool, bool]:
        if self.reader == "stablehlo":
            return check_stablehlo(case, work, self.sample)
        if self.reader == "bytecode":
            assert self.worker is not None
            return check_bytecode(case, work, self.worker, self.sample())
        if self.reader == "strategy":
            return check_strategy(case, work, self.sample)
        if self.reader == "hardware":
            return check_hardware(case, work, self.sample)
        return check_rules(case, work, self.sample, self.refused_sample)

    def _save(self, case: Any, why: str) -> None:
        if self.save_dir is None:
            return
        self.save_dir.mkdir(parents=True, exist_ok=True)
        stem = self.save_dir / f"{self.reader}-{len(self.tally.failures):04d}"
        if isinstance(case, bytes):
            stem.with_suffix(".mlir").write_bytes(case)
        elif isinstance(case, tuple):
            stem.with_suffix(".dl").write_text(f"// --rules file: {case[0]}\n{case[1]}")
        else:
            suffix = {"stablehlo": ".mlir", "strategy": ".json", "hardware": ".toml"}[self.reader]
            stem.with_suffix(suffix).write_text(case)
        stem.with_suffix(".why.txt").write_text(why + "\n")

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
