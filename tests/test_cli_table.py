"""Every command x every bad input (issue 11): exit code 2, one ``toast: error:`` line, no
traceback, and no file left behind but the inputs the test wrote.

A row is ``(command, case)`` for every case whose option the command has. Cases marked
``early`` must be refused before the analysis: ``toast.analysis.named_dimensions.analyze`` is
patched to fail the test if called. The others fail while reading the input or analyzing.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from toast.cli import main

MLP = "toast.examples.mlp:mlp"
GPT = "toast.examples.gpt:gpt_small"
COMMANDS = ("analyze", "explain", "graph", "shard", "cost", "validate")
# The file each command writes, by option (explain writes none).
OUTPUTS = {"analyze": ("--json",), "explain": (), "graph": ("-o",), "shard": ("-o", "--emit"),
           "cost": ("--json",), "validate": ("--json",)}
SUFFIX = {"--json": ".json", "-o": ".json", "--emit": ".mlir"}


@dataclass(frozen=True)
class Case:
    """One bad input, for ``commands``; ``message`` is a fragment of the one error line."""

    name: str
    commands: tuple[str, ...]
    early: bool
    message: str
    input: str | None = None  # replaces the program input
    extra: tuple[str, ...] = ()
    output: str | None = None  # "OPTION=PATH": an output with PATH relative to tmp_path (or absolute)
    strategy: str | None = None  # validate: the strategy file's name among the inputs
    replace: dict[str, str] = field(default_factory=dict)  # base option -> new value


def _base(command: str, case: Case, strategy: str) -> list[str]:
    program = case.input or MLP
    options = {
        "analyze": [], "explain": [], "graph": ["--color", "0"],
        "shard": ["--mesh", "batch=2", "--batch", "x:0"], "cost": ["--hardware", "h100"],
        "validate": ["--devices", "2"],
    }[command]
    for option, value in case.replace.items():
        options[options.index(option) + 1] = value
    positional = {"explain": ["x:0", "result:0"], "validate": [strategy]}.get(command, [])
    return [command, program, *positional, *options, "--engine", "embedded"]


def _cases() -> list[Case]:
    cases = [
        Case("garbage bytes in .mlir", COMMANDS, False, "garbage.mlir", input="garbage.mlir"),
        Case("truncated MLIR bytecode", COMMANDS, False, "truncated.mlir", input="truncated.mlir"),
        Case("missing input file", COMMANDS, False, "missing.mlir", input="missing.mlir"),
        Case("unknown module:function", COMMANDS, False, "mlp", input="toast.examples.mlp:nope"),
        Case("engine timeout", COMMANDS, False, "timed out", input=GPT, extra=("--timeout", "0.05")),
    ]
    for option in ("--json", "-o", "--emit"):
        commands = tuple(c for c in COMMANDS if option in OUTPUTS[c])
        cases += [
            Case(f"{option} is a directory", commands, True, "is a directory", output=f"{option}=outdir"),
            Case(f"{option} in a missing directory", commands, True, "does not exist",
                 output=f"{option}=missing/out{{suffix}}"),
            Case(f"{option} unwritable", commands, True, "cannot write in /proc",
                 output=f"{option}=/proc/toast{{suffix}}"),
        ]
    cases += [
        Case("bad --mesh", ("shard",), True, "--mesh", replace={"--mesh": "batch=two"}),
        Case("unknown --strategy", ("shard",), True, "strategy", extra=("--strategy", "nope")),
        Case("unknown --hardware", ("shard",), True, "nope", extra=("--hardware", "nope")),
        Case("unknown --strategy name", ("cost",), True, "known: data_parallel, megatron, fsdp, sequence",
             extra=("--mesh", "batch=2", "--strategy", "nope")),
        Case("manual strategy without --mesh", ("cost",), True, "needs --mesh", extra=("--strategy", "megatron")),
        Case("unknown --hardware for cost", ("cost",), True, "unknown hardware 'nope'", replace={"--hardware": "nope"}),
        Case("no micro-batches", ("cost",), True, "--microbatches: 0: give 1 or more", extra=("--microbatches", "0")),
        Case("bad --color", ("graph",), True, "--color", replace={"--color": "seq"}),
        Case("bad --format", ("graph",), True, "--format png", extra=("--format", "png")),
        Case("bad -o suffix", ("graph",), True, ".png", output="-o=x.png"),
        Case("strategy malformed JSON", ("validate",), True, "bad.json", strategy="bad.json"),
        Case("strategy without arguments", ("validate",), True, "arguments", strategy="noargs.json"),
        Case("strategy axis not in mesh", ("validate",), True, "nope", strategy="badaxis.json"),
        Case("--devices mismatch", ("validate",), True, "--devices 3", replace={"--devices": "3"}),
        Case("bad dim for explain", ("explain",), True, "VALUE:DIM", input=None, extra=()),
        # Issue 23: numbers, mesh sizes, long names and strategy files that disagree with themselves.
        Case("--timeout nan", COMMANDS, True, "argument --timeout: 'nan': give a finite number of seconds",
             extra=("--timeout", "nan")),
        Case("--timeout inf", COMMANDS, True, "argument --timeout: 'inf'", extra=("--timeout", "inf")),
        Case("mesh size in other digits", ("shard",), True, "--mesh batch=²", replace={"--mesh": "batch=²"}),
        Case("mesh of more devices than any machine", ("shard",), True, "at most 16,777,216",
             replace={"--mesh": "batch=99999999999999999999999"}),
        Case("cost --microbatches nan", ("cost",), True, "'nan' is not a whole number",
             extra=("--microbatches", "nan")),
        Case("validate --seed -1", ("validate",), True, "argument --seed: -1", extra=("--seed", "-1")),
        Case("strategy spec edited", ("validate",), False, "does not match the file's state",
             strategy="edited.json"),
        Case("strategy state invalid", ("validate",), False, "the state is not a valid sharding",
             strategy="invalid_state.json"),
        Case("cost of an edited strategy", ("cost",), False, "does not match the file's state",
             extra=("--strategy", "edited.json")),
        Case("cost of an invalid state", ("cost",), False, "the state is not a valid sharding",
             extra=("--strategy", "invalid_state.json")),
    ]
    for option in ("--json", "-o", "--emit"):
        commands = tuple(c for c in COMMANDS if option in OUTPUTS[c])
        cases.append(Case(f"{option} name too long for its temporary file", commands, True, "File name too long",
                          output=f"{option}={'n' * 245}{{suffix}}"))
    return cases


# The engine's time limit is an interval timer's signal: where it lands in a garbage-collection callback (JAX's),
# Python reports the exception as ignored, and the timer, repeating every 50 ms, stops the engine on its next tick.
_TIMER_IN_A_GC_CALLBACK = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
ROWS = [pytest.param(command, case, id=f"{command}: {case.name}",
                     marks=[_TIMER_IN_A_GC_CALLBACK] if case.name == "engine timeout" else [])
        for case in _cases() for command in case.commands]


@pytest.fixture(scope="module")
def good_strategy(tmp_path_factory) -> dict:
    """A strategy file for the MLP on a 2-device mesh, as ``toast shard -o`` writes it."""
    path = tmp_path_factory.mktemp("strategy") / "s.json"
    assert main(["shard", MLP, "--mesh", "batch=2", "--engine", "embedded", "-o", str(path)]) == 0
    return json.loads(path.read_text())


def _write_inputs(tmp_path: Path, strategy: dict) -> None:
    (tmp_path / "garbage.mlir").write_bytes(bytes(range(256)) * 4)
    bytecode = _mlp_bytecode()
    (tmp_path / "truncated.mlir").write_bytes(bytecode[: len(bytecode) // 2])
    (tmp_path / "outdir").mkdir()
    (tmp_path / "s.json").write_text(json.dumps(strategy))
    (tmp_path / "bad.json").write_text('{"mesh": ')
    (tmp_path / "noargs.json").write_text(json.dumps({k: v for k, v in strategy.items() if k != "arguments"}))
    badaxis = json.loads(json.dumps(strategy))
    first = badaxis["arguments"][0]
    first["partition_spec"] = ["nope"] + list(first["partition_spec"][1:])
    (tmp_path / "badaxis.json").write_text(json.dumps(badaxis))
    edited = json.loads(json.dumps(strategy))  # x split on batch in the state; the spec says dim 1
    edited["arguments"][0]["partition_spec"] = [None, "batch"]
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    invalid = json.loads(json.dumps(strategy))  # x's two dims both on batch
    masks = np.frombuffer(zlib.decompress(base64.b64decode(invalid["state"]["masks"])), dtype=np.uint8).copy()
    masks[1] = masks[0]
    invalid["state"]["masks"] = base64.b64encode(zlib.compress(masks.tobytes())).decode("ascii")
    (tmp_path / "invalid_state.json").write_text(json.dumps(invalid))


_BYTECODE: list[bytes] = []


def _mlp_bytecode() -> bytes:
    """The MLP as MLIR bytecode (what ``jax.export`` serializes), made once."""
    if not _BYTECODE:
        import jax
        from jax import export

        from toast.frontend.loading import resolve_factory

        fn, args = resolve_factory(MLP)()
        shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
        _BYTECODE.append(export.export(jax.jit(fn))(*shapes).mlir_module_serialized)
    return _BYTECODE[0]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(("command", "case"), ROWS)
def test_bad_input(command, case, tmp_path, monkeypatch, capsys, good_strategy):
    monkeypatch.chdir(tmp_path)
    _write_inputs(tmp_path, good_strategy)
    if case.early:
        monkeypatch.setattr("toast.analysis.named_dimensions.analyze",
                            lambda *a, **k: pytest.fail("analyzed before refusing the bad input"))
    argv = _base(command, case, case.strategy or "s.json")
    if case.name == "bad dim for explain":
        argv[2] = "x"
    argv += list(case.extra)
    if case.output:
        option, path = case.output.split("=", 1)
        suffix = ".dot" if command == "graph" else SUFFIX[option]
        argv += [option, path.format(suffix=suffix)]
    before = _files(tmp_path)
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("toast: error: ")
    assert "Traceback" not in captured.err + captured.out
    assert case.message in lines[0], lines[0]
    assert _files(tmp_path) == before  # no output, no temporary left behind
