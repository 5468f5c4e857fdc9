"""What a user waits for on big programs (issue 25): `toast analyze` cold and cached, and a cold `toast autoshard`
of a Llama-3-8B-shaped step, in CPU seconds of the `toast` process (user + sys, its workers included).

    python benchmarks/bench_interactive.py [--repeat 3] [--skip-autoshard]

The programs are lowered once to `.mlir` files in a temporary folder (lowering is not part of `toast analyze
FILE.mlir`): the 12-layer GPT step (`toast.examples.gpt:gpt_train_step?layers=12`), the Gemma-2B step
(`toast.examples.gemma:t2b`) and the Llama-3-8B-shaped step (`benchmarks.programs.llama3:llama3` at dim 4096,
32 layers, 32 heads, 8 KV heads, FFN 14336, vocab 128256, seq 8192, batch 16; remat per layer). Each command runs
in a process of its own with the embedded engine:

* cold: `toast analyze FILE --engine embedded --no-cache`;
* warm: `toast analyze FILE --engine embedded` with a cache folder the first such run filled;
* autoshard: `toast autoshard benchmarks.programs.llama3:llama3 --arg ... --mesh dp=8,tp=8 --hardware h100
  --no-cache` (the lowering included), with its predicted peak per device.

The best of ``--repeat`` runs is reported (the machine is shared). Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from toast.frontend.loading import load_program_text

LLAMA3_8B = {"layers": 32, "d_model": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256, "seq": 8192,
             "batch": 16}
PROGRAMS = {
    "12-layer GPT step": "toast.examples.gpt:gpt_train_step?layers=12",
    "T2B (Gemma-2B) step": "toast.examples.gemma:t2b",
    "Llama-3-8B-shaped step": "benchmarks.programs.llama3:llama3?" + "&".join(f"{k}={v}" for k, v in
                                                                             LLAMA3_8B.items()),
}


def _cpu_of(command: list[str], *, env: dict[str, str]) -> tuple[float, str]:
    """CPU seconds (user + sys) of ``command`` run to the end, and its standard output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per point; the best is reported")
    parser.add_argument("--skip-autoshard", action="store_true")
    options = parser.parse_args()
    toast_command = [sys.executable, "-m", "toast"]
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "TOAST_CACHE_DIR": str(Path(folder) / "cache")}
        env.pop("TOAST_NO_CACHE", None)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
        print("| program | ops | `.mlir` MB | cold CPU s | warm CPU s |")
        print("|---|---|---|---|---|")
        for label, source in PROGRAMS.items():
            text, _ = load_program_text(source)
            path = Path(folder) / (label.split()[0] + ".mlir")
            path.write_text(text)
            analyze = [*toast_command, "analyze", str(path), "--engine", "embedded"]
            cold = min(_cpu_of([*analyze, "--no-cache"], env=env)[0] for _ in range(options.repeat))
            _, out = _cpu_of([*analyze, "--json", str(Path(folder) / "analysis.json")], env=env)  # fills the cache
            ops = json.loads((Path(folder) / "analysis.json").read_text())["stats"]["ops"]
            warm = min(_cpu_of(analyze, env=env)[0] for _ in range(options.repeat))
            print(f"| {label} | {ops:,} | {len(text) / 1e6:.2f} | {cold:.2f} | {warm:.2f} |", flush=True)
        if options.skip_autoshard:
            return
        arguments = [part for key, value in LLAMA3_8B.items() for part in ("--arg", f"{key}={value}")]
        strategy = Path(folder) / "strategy.json"
        command = [*toast_command, "autoshard", "benchmarks.programs.llama3:llama3", *arguments, "--mesh", "dp=8,tp=8",
                   "--hardware", "h100", "--no-cache", "-o", str(strategy)]
        best = min(_cpu_of(command, env=env)[0] for _ in range(options.repeat))
        document = json.loads(strategy.read_text())
        print()
        print("| command | CPU s | predicted step s | peak per device GiB | fits 80 GB |")
        print("|---|---|---|---|---|")
        cost = document["cost"]
        peak = float(cost["peak_bytes"])
        print(f"| autoshard Llama-3-8B-shaped, dp=8,tp=8, h100 | {best:.2f} | {float(cost['step_time_s']):.3f} | "
              f"{peak / 2**30:.1f} | {'no' if document['search']['over_memory'] else 'yes'} |")


if __name__ == "__main__":
    main()
