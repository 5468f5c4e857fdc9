"""Fuzzing the readers a user feeds (issue 11), a bounded deterministic slice: mutated StableHLO
text and bytecode, strategy files, hardware profiles and user ``.dl`` files each end in a result
or in one ``toast: error:`` line with exit status 2; never a traceback, a hang or a file left
behind (generators and checks: ``tests/fuzz_inputs.py``; the long run:
``benchmarks/bench_fuzz.py``). Then the regression tests of the bugs the fuzzer found."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import zlib

import fuzz_inputs
import pytest
from hypothesis import HealthCheck, given, settings

from toast.cli import main

# Inputs per reader in the default run (about 30 s in all on a 2-core machine).
EXAMPLES = {"stablehlo": 120, "bytecode": 40, "strategy": 120, "hardware": 120, "rules": 40}


def _fuzz(reader: str) -> None:
    fuzzer = fuzz_inputs.Fuzzer(reader, cli_every=10)

    @settings(max_examples=EXAMPLES[reader], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(fuzz_inputs.STRATEGIES[reader]())
    def fuzz(case):
        before = len(fuzzer.tally.failures)
        fuzzer(case)
        assert len(fuzzer.tally.failures) == before, fuzzer.tally.failures[-1]

    try:
        fuzz()
    finally:
        fuzzer.close()
    assert fuzzer.tally.tried >= EXAMPLES[reader] and fuzzer.tally.refused > 0


@pytest.mark.parametrize("reader", fuzz_inputs.READERS)
def test_fuzzed_inputs_end_in_a_result_or_one_error_line(reader):
    _fuzz(reader)


# Regression tests of the bugs the fuzzer found.


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("toast: error: "), err
    return err[0]


@pytest.mark.parametrize("edit", [
    ('loc("x")', 'loc("\\FFx")'),                      # an argument's name
    ("module @jit_mlp", 'module @"jit_\\C3"'),        # the module's name
    ('loc("jit")', 'loc("\\E2\\82":3:4)'),           # a location's file name
])
def test_a_string_literal_that_is_not_utf8_is_one_error_line(edit, tmp_path, capsys):
    """StableHLO text whose string escapes spell bytes that are not UTF-8 aborted the process
    (``terminate called after throwing ... nanobind ... conversion error``) while reading names
    and locations. Such text is now read first in a child process: it reads, or its crash is
    one error line."""
    text = fuzz_inputs.stablehlo_texts()[0]
    assert edit[0] in text
    (tmp_path / "bad.mlir").write_text(text.replace(edit[0], edit[1], 1))
    code = main(["analyze", str(tmp_path / "bad.mlir"), "--engine", "embedded"])
    if code != 0 or edit[0].startswith("module"):  # the module's name: the bindings do stop there
        assert code == 2
        assert "is not UTF-8 text once read" in _one_error_line(capsys)


def test_escapes_that_spell_utf8_still_read(tmp_path, capsys):
    text = fuzz_inputs.stablehlo_texts()[0].replace('loc("x")', 'loc("\\C3\\A9\\n\\22x")', 1)
    (tmp_path / "ok.mlir").write_text(text)
    assert main(["analyze", str(tmp_path / "ok.mlir"), "--engine", "embedded"]) == 0


# Bytecode the fuzzer made (zlib, base64): a mutant of the tiny scan's portable artifact that
# makes MLIR's bytecode reader (jaxlib 0.10.2) crash with a segmentation fault, and one of mlp's
# bytecode whose error message the bindings could not decode (the process aborted:
# ``terminate called after throwing an instance of 'nanobind::builtin_exception'``).
SEGFAULT_BYTECODE = (
    "eNplUW1rG0cQ3r3VZH0sx6IehxDiEEIIVRjp4piQpnFsXBMH4wjnhRBCCOIkrexz7q13e5WcUooppZRSSgj9I/1W+qE/oP+gf6J/"
    "obM2Vd/2uNl5Zp5ndnZ2/OiPp8740dHTW9ujm6Obp5EmtM8p2HXKJOPcbYDdanf77JcfG/Qdl0IIKaQrWsJ4rrhaGBFt92rDT8qW"
    "xLzE2Po3fJNqXWcB2oI22ryFS8p2Q1rntbb35CV40IBmXQK0/HuUwvv34DNoiKaANnSg62BXHca6PehBHwaw6bgw9Le2IfBvU9jq"
    "OTbB1fVQuu3vUYC7vnvsjZkPJ0POj5s9/9lzuDd8wV/7Y7jvvQr91xPYG9r8J6v7wptFvjqF/SvY+NV786mfZHCA8Herc+CXFTwY"
    "LrktB/DQdvwvvoQj7xIrf4WVx83bvvuN9y3C7xCe4EE/MDgWlDJgtE5bYG1YFhNmv2QtuESAvrVv7AZayqhlAQduM4EKRqlVq/0G"
    "9An1KK/9zKjNHlPGa8+Z43JxX+67D4h9eIRUwPDh5xw13D78GlBuA9S+Z4I9DmxeO2C2yygRn1DBHOdQOkhk8oY0QuSh6oZxyQcb"
    "Y7ffd73Ow5M252Dboo7v1an3Bpti/6Bb77pNfD5P1KdVFOsoJYsqnZFSh9NYncVnJMnmVaxIoXRVpGQWxjGZZ3pyqlJVhDGZZSly"
    "U02mRRbOZ2GpJ1E6mUcJScJVlFS4x/loJ85QWe6OEJBgmRVvgiSM0kBnKAjUR2GSx6oMDDW/+BdBlboMFtXbt1g2r3Rp8oWKK3Ie"
    "6Q+RPwj+2U1yFmejtEomeVjoSEfY3N+xQuVxhB0a6cQ0ch6uRoUqq9j0vMjItU/MwSSvpkgmeRF9FmplJB8bY25FVmS5RZa3SJwt"
    "VTExIzHD+v+9FkWWapXOg7+mmZnu12Ci1QovtJ7NjrnFKi92/0sh0wutZtlclWTn+jl2SaCTPFhE6XwyK8LyzBReT8Q4ZkaDdYhs"
    "7Em4Qx3q073+M07fdW16QRFvonnF7rC7fwIiafJp"
)
ABORT_BYTECODE = (
    "eNotjN9KAlEQxnd2Gg7LYRmWw2FZDsNBlkWWWERExERERCJMpCQiJMKiu8CbIKIH8BF6lB6qi16hYzbDfB/zmz/Ly5/rdP26fXx5"
    "JqAMUCOzyZ0v2/i1F3hSrDWHcjq45qOEZHYcYDDN5g+4I8PqsNUxunMYaP2ttQdkdF65EKyMz42Kz068HUzIUp4BSQuoIIdkEpuQ"
    "kKeWOKFSPFBFbamAaqmBTqUBaiTt2h4K9RulFkUlwxF1mrHayJK6dnouPGvmKqtvqSd80SyQqC+rKxrYdTi6CUfLoi/pnd2E9j60"
    "q/BjizQsnS8AQUbeZBBF0cNnkAhpt8shoOg/Sov4luL7h4xlIlOZlbnMPSeHGcRxTfEvDekmyg=="
)


@pytest.mark.parametrize("blob", [SEGFAULT_BYTECODE, ABORT_BYTECODE], ids=["segfault", "abort"])
def test_bytecode_that_crashes_mlir_is_one_error_line(blob, tmp_path, capsys):
    """toast reads bytecode in a child process now, and reports its crash in one line."""
    (tmp_path / "bad.mlir").write_bytes(zlib.decompress(base64.b64decode(blob)))
    assert main(["analyze", str(tmp_path / "bad.mlir"), "--engine", "embedded", "--json",
                 str(tmp_path / "out.json")]) == 2
    assert "unreadable MLIR bytecode" in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.mlir"]


def test_a_multi_line_mlir_message_is_one_error_line(tmp_path, capsys):
    """MLIR's "block with no terminator, has <op>" printed the op over many lines."""
    text, found = re.subn(r"\n    return %1#2, %1#3 : [^\n]*", "", fuzz_inputs.stablehlo_texts()[2], count=1)
    assert found == 1  # the scan's entry function without its return: the block ends in the while op
    (tmp_path / "bad.mlir").write_text(text)
    assert main(["analyze", str(tmp_path / "bad.mlir"), "--engine", "embedded"]) == 2
    assert _one_error_line(capsys).endswith(": block with no terminator (...)")


def test_a_crash_of_the_bytecode_child_is_one_error_line(tmp_path, monkeypatch):
    """The child process dying (as MLIR's reader does on some inputs) is reported, not raised."""
    from toast.frontend import stablehlo

    real_run = subprocess.run

    def crash(command, **kwargs):
        return real_run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], **kwargs)

    monkeypatch.setattr(subprocess, "run", crash)
    (tmp_path / "x.mlir").write_bytes(fuzz_inputs.bytecodes()[0])
    with pytest.raises(stablehlo.InputError, match="crashed on it"):
        stablehlo.read_file(tmp_path / "x.mlir")
