"""Batch work that survives faults: Ctrl-C, SIGTERM and SIGKILL of the parent, and jobs that crash, are
killed for memory, call ``sys.exit`` or hang.

What must hold: no worker outlives the command (checked by PID, parent killed or not); Ctrl-C and SIGTERM
end the command within 2 s with exit 130 / 143, one line on stderr and no partial file; a sweep records every
bad job with its reason and runs the others, writes its summary whatever happened, and refuses a folder
another sweep is writing. The misbehaving factories are in ``tests/faulty_jobs.py``.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faulty_jobs import alive, descendants

from toast.cli import main
from toast.evaluation.sweep import load_sweep, sweep

TESTS = Path(__file__).parent
ROOT = TESTS.parent
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find processes")


def _workers(pid: int, count: int) -> set[int]:
    """The descendants of ``pid`` once there are ``count`` (else empty)."""
    found = descendants(pid)
    return found if len(found) >= count else set()


def _wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    """``python -m toast ARGS`` in its own process group (as a shell runs a command), output captured."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]))
    return subprocess.Popen([sys.executable, "-m", "toast", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


SLOW_SWEEP = """
[sweep]
models = ["faulty_jobs:slow?seconds=120", "faulty_jobs:slow?seconds=121", "mlp"]
meshes = ["batch=4,model=2"]
rollouts = 20
"""


def _running_sweep(tmp_path: Path) -> tuple[subprocess.Popen, set[int]]:
    (tmp_path / "sweep.toml").write_text(SLOW_SWEEP)
    process = _start(["sweep", "sweep.toml", "-o", "out", "--jobs", "2"], tmp_path)
    # Two job workers and multiprocessing's resource tracker, the jobs under way.
    workers = _wait_for(lambda: _workers(process.pid, 3), 60,
                        "the sweep's workers")
    time.sleep(1.0)
    return process, workers


def _no_partial_files(folder: Path) -> None:
    assert not [p for p in folder.rglob("*") if "partial" in p.name or p.name.startswith(".summary")], \
        list(folder.rglob("*"))


@pytest.mark.parametrize("sent, status, line", [(signal.SIGINT, 130, "toast: interrupted"),
                                                (signal.SIGTERM, 143, "toast: terminated")])
def test_a_stopped_sweep_exits_at_once_with_its_summary_and_no_worker(tmp_path, sent, status, line):
    process, workers = _running_sweep(tmp_path)
    start = time.monotonic()
    if sent == signal.SIGINT:
        os.killpg(process.pid, sent)  # Ctrl-C: the terminal signals the whole group
    else:
        process.send_signal(sent)
    out, err = process.communicate(timeout=30)
    assert time.monotonic() - start <= 2.0 + 0.5, time.monotonic() - start
    assert process.returncode == status, err
    assert err.strip().splitlines()[-1] == line and "Traceback" not in err, err
    _wait_for(lambda: not alive(workers), 5, "the workers to end")
    rows = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    assert len(rows) == 3 and {row["status"] for row in rows} <= {"ok", "not run"}
    assert sum(row["status"] == "not run" for row in rows) >= 2  # the two slow jobs
    _no_partial_files(tmp_path / "out")


def test_a_killed_sweep_leaves_no_process_and_releases_its_output(tmp_path):
    process, workers = _running_sweep(tmp_path)
    process.kill()
    # The caller reading the output gets its end: every holder of the pipes (workers, tracker) is gone.
    process.communicate(timeout=10)
    _wait_for(lambda: not alive(workers), 10, "the workers to end")


def test_a_second_sweep_into_the_same_folder_is_refused(tmp_path, capsys):
    process, _ = _running_sweep(tmp_path)
    try:
        assert main(["sweep", str(tmp_path / "sweep.toml"), "-o", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"another sweep (pid {process.pid}) is writing this folder" in err[0], err
    finally:
        process.kill()
        process.communicate(timeout=10)


def test_bad_jobs_are_recorded_with_their_reason_and_the_others_run(tmp_path):
    (tmp_path / "sweep.toml").write_text("""
[sweep]
models = ["faulty_jobs:crash", "faulty_jobs:exits", "faulty_jobs:hangs", "faulty_jobs:good?batch=64", "mlp"]
meshes = ["batch=4,model=2"]
rollouts = 20
""")
    jobs = load_sweep(tmp_path / "sweep.toml").jobs
    start = time.monotonic()
    records = sweep(jobs, tmp_path / "out", workers=2, job_timeout=15)
    assert time.monotonic() - start < 90
    by_model = {record["settings"]["model"]: record for record in records}
    assert by_model["faulty_jobs:crash"]["status"] == "error"
    assert "killed by SIGKILL (out of memory?)" in by_model["faulty_jobs:crash"]["error"]
    assert by_model["faulty_jobs:exits"]["error"] == "the job called sys.exit(3)"
    assert by_model["faulty_jobs:hangs"]["error"] == "timed out after 15 s (--job-timeout)"
    assert by_model["faulty_jobs:good?batch=64"]["status"] == "ok" and by_model["mlp"]["status"] == "ok"
    # Each bad job is recorded once: a rerun runs nothing and crashes on nothing.
    ran = []
    again = sweep(jobs, tmp_path / "out", workers=2, job_timeout=15, progress=lambda r, d, t: ran.append(r))
    assert ran == [] and [r["status"] for r in again] == [r["status"] for r in records]
    assert len(list((tmp_path / "out" / "jobs").glob("*.json"))) == 5
    markdown = (tmp_path / "out" / "summary.md").read_text()
    assert "timed out after 15 s" in markdown and "killed by SIGKILL" in markdown


def test_an_unreadable_record_is_run_again(tmp_path):
    (tmp_path / "sweep.toml").write_text('[sweep]\nmodels = ["mlp"]\nmeshes = ["batch=4,model=2"]\nrollouts = 20\n')
    jobs = load_sweep(tmp_path / "sweep.toml").jobs
    sweep(jobs, tmp_path / "out", workers=1)
    record = tmp_path / "out" / "jobs" / f"{jobs[0].key}.json"
    expected = json.loads(record.read_text())["comparison"]
    record.write_text('{"job": "half a rec')
    ran = []
    again = sweep(jobs, tmp_path / "out", workers=1, progress=lambda r, d, t: ran.append(r))
    assert len(ran) == 1 and again[0]["comparison"]["toast"]["state"] == expected["toast"]["state"]


def test_ctrl_c_during_a_search_with_workers_exits_at_once(tmp_path):
    output = tmp_path / "s.json"
    process = _start(["autoshard", "toast.examples.gpt:gpt_small", "--mesh", "batch=2,model=4", "--workers", "2",
                      "--rollouts", "1000000", "-o", str(output)], tmp_path)
    workers = _wait_for(lambda: _workers(process.pid, 2), 120,
                        "the search's workers")
    time.sleep(1.0)
    start = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert time.monotonic() - start <= 2.5, time.monotonic() - start
    assert process.returncode == 130 and err.strip().splitlines()[-1] == "toast: interrupted", err
    assert "Traceback" not in err and not output.exists() and not list(tmp_path.glob(".s.json*"))
    _wait_for(lambda: not alive(workers), 5, "the workers to end")


def test_a_killed_search_leaves_no_worker(tmp_path):
    process = _start(["autoshard", "toast.examples.gpt:gpt_small", "--mesh", "batch=2,model=4", "--workers", "2",
                      "--rollouts", "1000000"], tmp_path)
    workers = _wait_for(lambda: _workers(process.pid, 2), 120,
                        "the search's workers")
    process.kill()
    process.communicate(timeout=10)
    _wait_for(lambda: not alive(workers), 10, "the workers to end")


def test_a_program_of_scalars_is_left_whole(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["autoshard", "faulty_jobs:scalars", "--mesh", "batch=4,model=2", "--workers", "1", "--engine",
                 "embedded", "-o", str(out)]) == 0
    document = json.loads(out.read_text())
    assert [argument["partition_spec"] for argument in document["arguments"]] == [[], []]
    assert main(["compare", "faulty_jobs:scalars", "--mesh", "batch=4,model=2", "--workers", "1", "--engine",
                 "embedded"]) == 0
    assert "| toast |" in capsys.readouterr().out


def test_a_strategy_file_is_the_same_in_every_run_on_any_number_of_workers(tmp_path):
    texts = set()
    for run, workers in enumerate(("1", "2", "2")):
        out = tmp_path / f"s{run}.json"
        assert main(["autoshard", "toast.examples.gpt:gpt_small", "--mesh", "batch=4,model=2", "--engine", "embedded",
                     "--rollouts", "300", "--workers", workers, "-o", str(out)]) == 0
        texts.add(out.read_text())
    assert len(texts) == 1
    assert json.loads(texts.pop())["search"]["evaluations"] > 1


def test_one_worker_survives_a_killed_job_too(tmp_path):
    """`--jobs 1` ran jobs in the sweep's own process: a job killed for memory killed the sweep (exit 137)."""
    (tmp_path / "sweep.toml").write_text('[sweep]\nmodels = ["faulty_jobs:crash", "mlp"]\n'
                                         'meshes = ["batch=4,model=2"]\nrollouts = 20\n')
    records = sweep(load_sweep(tmp_path / "sweep.toml").jobs, tmp_path / "out", workers=1)
    assert [r["status"] for r in records] == ["error", "ok"]
    assert "killed by SIGKILL" in records[0]["error"]


def test_a_killed_validate_leaves_no_xla_worker(tmp_path):
    strategy = tmp_path / "s.json"
    assert main(["shard", "toast.examples.gpt:gpt_small", "--mesh", "batch=2,model=4", "--strategy", "megatron",
                 "--engine", "embedded", "-o", str(strategy)]) == 0
    process = _start(["validate", "toast.examples.gpt:gpt_small", str(strategy), "--devices", "8", "--engine",
                      "embedded"], tmp_path)
    worker = _wait_for(lambda: _workers(process.pid, 1), 120, "the XLA check worker")
    time.sleep(1.5)  # it has its request and is compiling (about 4 s on 2 cores to finish by itself)
    process.kill()
    process.communicate(timeout=10)
    _wait_for(lambda: not alive(worker), 1.0, "the XLA worker to end with its parent")
