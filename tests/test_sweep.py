"""``toast sweep``: a batch of comparisons, locally in worker processes or as Ray tasks, with the same records.

What must hold: one record per job of the product; a failing job (an unknown model, a mesh that cannot be)
is a row with its error while the others run; a rerun runs nothing already recorded; local workers and a
local Ray cluster give the same strategies and costs (the search's budget is rollouts, its seed fixed).
"""

from __future__ import annotations

import csv
import json
import re

import pytest

from toast.cli import main
from toast.errors import ToastError
from toast.evaluation.sweep import load_sweep, sweep

SMALL = """
[sweep]
models = ["mlp", "transpose_matmul"]
meshes = ["batch=4,model=2", "batch=2,model=4", "a=8"]
hardware = ["a100_80gb", "tpu_v3"]
rollouts = 40
"""


def _settled(records):
    """The records without their timings (the rest must not depend on where the jobs ran)."""
    kept = []
    for record in records:
        record = json.loads(json.dumps(record))
        record.pop("job_seconds", None)
        if record["status"] == "ok":
            comparison = record["comparison"]
            for row in comparison["strategies"]:
                row.pop("search_seconds", None)
            comparison["toast"]["search"].pop("seconds", None)
            for row in record["report"]["strategies"]:
                row.pop("search_seconds", None)
        kept.append(record)
    return kept


def test_sweep_file_is_the_product_of_its_lists(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(SMALL.replace("rollouts = 40", "rollouts = [40, 80]"))
    assert [job.rollouts for job in load_sweep(path).jobs[:4]] == [40, 80, 40, 80]
    path.write_text(SMALL)
    plan = load_sweep(path)
    assert len(plan.jobs) == 2 * 3 * 2
    assert plan.jobs[0].model == "mlp" and plan.jobs[0].mesh == "batch=4,model=2"
    assert plan.jobs[0].hardware == "a100_80gb" and plan.jobs[1].hardware == "tpu_v3"
    assert len({job.key for job in plan.jobs}) == 12


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    path = folder / "sweep.toml"
    path.write_text(SMALL)
    records = sweep(load_sweep(path).jobs, folder / "out", workers=2)
    return folder, records


def test_local_sweep_records_every_job_and_the_summaries(local_run):
    folder, records = local_run
    assert len(records) == 12 and all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    with open(folder / "out" / "summary.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["job"] for row in rows] == [r["job"] for r in records]
    for row in rows:
        assert float(row["toast_step_time_s"]) > 0
        # mlp has a roles file; transpose_matmul has none: its manual strategies come from the proposed roles
        assert float(row["toast_step_time_s"]) <= float(row["best_manual_step_time_s"]) * (1 + 1e-9)
    assert all(row["best_manual"] for row in rows)
    markdown = (folder / "out" / "summary.md").read_text()
    assert markdown.count("\n| mlp |") == 6 and markdown.count("\n| transpose_matmul |") == 6


def test_a_rerun_runs_no_recorded_job(local_run):
    folder, records = local_run
    ran = []
    again = sweep(load_sweep(folder / "sweep.toml").jobs, folder / "out", progress=lambda r, d, t: ran.append(r))
    assert ran == [] and _settled(again) == _settled(records)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # Ray starts its processes by fork and exec
def test_ray_cluster_gives_the_same_records(local_run, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install ray; .ci/run installs it)")
    folder, records = local_run
    on_ray = sweep(load_sweep(folder / "sweep.toml").jobs, tmp_path / "ray", ray_address="local")
    assert _settled(on_ray) == _settled(records)


def test_failing_jobs_are_rows_with_their_error(tmp_path, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text('[sweep]\nmodels = ["mlp", "no_such_model"]\nmeshes = ["batch=4,model=2", "batch=0"]\n'
                    'rollouts = 20\n')
    assert main(["sweep", str(path), "-o", str(tmp_path / "out"), "--jobs", "1"]) == 1
    out, err = capsys.readouterr()
    assert "3 of 4 jobs failed" in err
    rows = {(r["model"], r["mesh"]): r for r in csv.DictReader(open(tmp_path / "out" / "summary.csv"))}
    assert rows[("mlp", "batch=4,model=2")]["status"] == "ok"
    assert "batch=0" in rows[("mlp", "batch=0")]["error"]
    assert "no_such_model" in rows[("no_such_model", "batch=4,model=2")]["error"]
    assert "| no_such_model | batch=4,model=2 |" in out


@pytest.mark.parametrize("text, message", [
    ("[sweep]\nmeshes = ['a=2']\n", "[sweep] models must be a non-empty list of strings"),
    ("[sweep]\nmodels = ['mlp']\nmeshes = ['a=2']\nrollouts = 0\n", "rollouts must be a positive integer"),
    ("[sweep]\nmodels = ['mlp']\nmeshes = ['a=2']\nrollouts = [10, 0]\n", "or a non-empty list of them"),
    ("[sweep]\nmodels = ['mlp']\nmeshes = ['a=2']\nseeds = [-1]\n", "seeds must be a non-empty list of integers, 0 or"),
    ("[sweep]\nmodels = ['mlp']\nmeshes = ['a=2']\nmemory = [inf]\n", "memory must list GiB per device"),
    ("[sweep]\nmodels = ['mlp']\nmeshes = ['a=2']\nmemory = [-1]\n", "memory must list GiB per device"),
    ("[sweep]\nmodels = ['mlp']\nmeshes = ['a=2']\ncolour = 1\n", "unknown key 'colour'"),
    ("[sweep]\nmodels = ['mlp'\n", "sweep.toml: "),
])
def test_bad_sweep_files(text, message, tmp_path, capsys):
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    assert main(["sweep", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "out").exists()


def test_summary_cells_are_escaped():
    from toast.evaluation.sweep import SUMMARY_FIELDS, summary_markdown

    row = {field: "" for field in SUMMARY_FIELDS}
    row.update({"model": "pkg.m:f?tag='a|b'", "mesh": "batch=4", "hardware": "h100", "memory_gib": "hbm", "seed": 0,
                "variant": "a|b", "engine": "embedded", "status": "error",
                "error": "no <module> named x & y | z\nsecond line"})
    line = summary_markdown([row]).splitlines()[2]
    assert line == ("| pkg.m:f?tag='a\\|b' | batch=4 | h100 | hbm | 0 | a\\|b | - | - | - | - | - | - | - | - | - | "
                    "- | no &lt;module&gt; named x &amp; y \\| z second line |")
    assert line.count(" | ") == 16  # 17 cells, whatever the text held


def test_analysis_variants_are_an_axis_of_the_sweep(tmp_path):
    """``variants``: each job analyzes with its variant, its key names a variant other than the default (the
    default's key is as before), and the summary has the variant, colors, resolution bits and unruled ops.
    transpose_matmul has 2 colors either way and 1 resolution bit by default; without box compatibility its
    one conflict group splits in two (2 bits)."""
    path = tmp_path / "sweep.toml"
    path.write_text('[sweep]\nmodels = ["transpose_matmul"]\nmeshes = ["batch=4,model=2"]\nrollouts = 20\n'
                    'variants = ["default", "no_box"]\n')
    jobs = load_sweep(path).jobs
    assert [job.variant for job in jobs] == ["default", "no_box"]
    assert jobs[0].key == "transpose_matmul__batch-4-model-2__a100_80gb__hbm__s0__r20"
    assert jobs[1].key == jobs[0].key + "__v-no_box"
    records = sweep(jobs, tmp_path / "out", workers=1)
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    with open(tmp_path / "out" / "summary.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["variant"], row["colors"], row["resolution_bits"], row["unruled_ops"]) for row in rows] == [
        ("default", "2", "1", "0"), ("no_box", "2", "2", "0")]
    assert "| transpose_matmul | batch=4,model=2 | a100_80gb | hbm | 0 | no_box | 2 | 2 | 0 |" in (
        tmp_path / "out" / "summary.md").read_text()


@pytest.mark.parametrize("line, message", [
    ('variants = ["nope"]', "[sweep] variants: "),
    ('engine = "datalog"', "engine 'datalog': give embedded, souffle or auto"),
    ('rules = "missing_folder"', "rules: no folder 'missing_folder'"),
])
def test_a_bad_variant_engine_or_rules_folder_is_refused_when_read(tmp_path, line, message):
    path = tmp_path / "sweep.toml"
    path.write_text(f'[sweep]\nmodels = ["mlp"]\nmeshes = ["batch=8"]\n{line}\n')
    with pytest.raises(ToastError, match=re.escape(message)):
        load_sweep(path)


@pytest.mark.parametrize("plant, message", [
    ("symlink", "is a symbolic link, not the sweep's lock file; remove it"),
    ("hard link", "is a link to another file, not the sweep's lock file; remove it"),
    ("fifo", "is not a regular file, not the sweep's lock file; remove it"),
])
def test_a_link_planted_at_the_lock_is_refused_and_its_target_kept(plant, message, tmp_path, capsys):
    """``DIR/.lock`` is opened without following a link: a link planted there (by whoever can write the folder)
    would have the sweep truncate its target and write a pid into it."""
    import os

    path = tmp_path / "sweep.toml"
    path.write_text('[sweep]\nmodels = ["mlp"]\nmeshes = ["batch=8"]\nrollouts = 20\n')
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    lock = out / ".lock"
    if plant == "symlink":
        lock.symlink_to(target)
    elif plant == "hard link":
        os.link(target, lock)
    else:
        os.mkfifo(lock)
    assert main(["sweep", str(path), "-o", str(out), "--jobs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"toast: error: -o {out}: {lock} {message}"], err
    assert target.read_text() == "keep me\n"
    assert not (out / "summary.csv").exists() and not any((out / "jobs").iterdir())
