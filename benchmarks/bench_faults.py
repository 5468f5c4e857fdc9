"""Fault injection on ``toast sweep``: 40 jobs of which 10% crash (SIGKILL, as the OOM killer does) and 5% hang,
with the sweep itself killed (SIGKILL) twice and restarted.

    python benchmarks/bench_faults.py [--jobs 2] [--job-timeout 20] [--kill-after 8 20]

Checks, and prints for BENCHMARKS.md: every good job recorded once and ok, every bad one recorded once with
its reason, no worker left behind by the killed sweeps (by PID), and the seconds each run took. The bad
factories are ``tests/faulty_jobs.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from faulty_jobs import alive, descendants  # noqa: E402  (the test support module: the same /proc readers)

GOOD = [f"faulty_jobs:good?batch={16 * k}" for k in range(1, 18)]  # 17 models x 2 seeds: 34 good jobs
BAD = {"faulty_jobs:crash": "killed by SIGKILL", "faulty_jobs:hangs": "timed out after"}
MODELS = GOOD + ["faulty_jobs:crash", "faulty_jobs:crash?variant=1", "faulty_jobs:hangs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--job-timeout", type=float, default=20.0)
    parser.add_argument("--kill-after", type=int, nargs="+", default=[8, 20],
                        help="kill the sweep when this many records exist (once per number)")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="toast-faults-"))
    (folder / "sweep.toml").write_text("[sweep]\nmodels = [" + ", ".join(json.dumps(m) for m in MODELS)
                                       + ']\nmeshes = ["batch=4,model=2"]\nseeds = [0, 1]\nrollouts = 20\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    command = [sys.executable, "-m", "toast", "sweep", "sweep.toml", "-o", "out", "--jobs", str(options.jobs),
               "--job-timeout", str(options.job_timeout)]
    records = folder / "out" / "jobs"
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
          f"{len(MODELS) * 2} jobs, --jobs {options.jobs}, --job-timeout {options.job_timeout:g}")
    runs = []
    orphans = 0
    for kill_at in [*options.kill_after, None]:
        start = time.monotonic()
        process = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        if kill_at is None:
            _, err = process.communicate(timeout=1800)
            runs.append(("to the end", process.returncode, time.monotonic() - start, len(list(records.glob("*.json")))))
            continue
        while process.poll() is None and len(list(records.glob("*.json"))) < kill_at:
            time.sleep(0.2)
        workers = descendants(process.pid)
        process.kill()
        process.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        orphans += len(alive(workers))
        runs.append((f"killed at {kill_at} records", -signal.SIGKILL, time.monotonic() - start,
                     len(list(records.glob("*.json")))))
    found = [json.loads(path.read_text()) for path in sorted(records.glob("*.json"))]
    good = [r for r in found if not r["settings"]["model"].startswith(("faulty_jobs:crash", "faulty_jobs:hangs"))]
    bad = [r for r in found if r not in good]
    reasons_right = all(BAD[r["settings"]["model"].split("?")[0]] in r.get("error", "") for r in bad)
    print("| run | exit | seconds | records after |")
    print("|---|---|---|---|")
    for label, code, seconds, count in runs:
        print(f"| {label} | {code} | {seconds:.1f} | {count} |")
    print(f"records: {len(found)} of {len(MODELS) * 2} (one file per job); good ok: "
          f"{sum(r['status'] == 'ok' for r in good)} of {len(GOOD) * 2}; bad recorded with their reason: "
          f"{len(bad) if reasons_right else 'NO'} of 6 ({', '.join(sorted({r['error'] for r in bad}))}); "
          f"workers left by the killed sweeps: {orphans}")


if __name__ == "__main__":
    main()
