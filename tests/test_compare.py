"""``toast compare``: toast's search against every manual strategy that applies, checked by XLA on request.

The expectations are not the cost model's numbers but what must hold whatever they are: every expert strategy
of ``toast.STRATEGY_NAMES`` has a row (priced, or the reason it does not apply); XLA runs
each one that applies on 8 host devices with the unsharded program's outputs; toast's estimated step time is
at most the best manual one that fits (the issue's acceptance), and it fits where one does.
"""

from __future__ import annotations

import json

import pytest

import toast
from toast.cli import main

MLP = "toast.examples.mlp:mlp"
MESH = ["--mesh", "batch=4,model=2"]


def test_compare_mlp_with_xla_on_host_devices(tmp_path, capsys):
    out = tmp_path / "compare.json"
    assert main(["compare", MLP, "--engine", "embedded", *MESH, "--rollouts", "200", "--workers", "1", "--validate",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    rows = {row["strategy"]: row for row in document["strategies"]}
    assert list(rows) == ["toast", *toast.STRATEGY_NAMES]
    # mlp.roles.toml names batch and mlp, not the sequence nor the experts: every strategy that needs either does
    # not apply, nor does fsdp_data_axes+megatron on two axes (maxtext: the batch on batch, the MLP on model).
    applied = [name for name, row in rows.items() if row["applies"]]
    assert applied == ["toast", "data_parallel", "megatron", "fsdp", "fsdp+megatron", "data_parallel_all", "fsdp_all",
                       "maxtext"]
    for name in applied:
        assert rows[name]["xla"]["numerics_match"], name
        assert rows[name]["xla"]["collectives_agree"] == rows[name]["xla"]["collectives"], name
        assert f"| {name} |" in printed
    assert "needs role 'sequence'" in rows["sequence"]["reason"]
    assert "needs role 'experts'" in rows["expert_parallel"]["reason"]
    assert "needs a mesh with three axes" in rows["fsdp_data_axes+megatron"]["reason"]
    best_manual = min(rows[name]["step_time_s"] for name in applied[1:] if not rows[name]["over_memory"])
    assert rows["toast"]["step_time_s"] <= best_manual
    # toast's gain over the best that fits and over FSDP over all devices: their step time over toast's.
    gains = document["gains"]
    assert rows[gains["best_expert"]]["step_time_s"] == best_manual
    assert gains["over_best_expert"] == pytest.approx(best_manual / rows["toast"]["step_time_s"])
    assert gains["over_fsdp_all"] == pytest.approx(rows["fsdp_all"]["step_time_s"] / rows["toast"]["step_time_s"])
    assert (f"gain over the best expert strategy ({gains['best_expert']}): {gains['over_best_expert']:.3f}x; over "
            f"FSDP over all devices (fsdp_all): {gains['over_fsdp_all']:.3f}x") in printed
    assert rows["toast"]["search_seconds"] > 0 and "search_seconds" not in rows["megatron"]
    assert document["toast"]["search"]["seed"] == 0  # toast's strategy file, whole


def test_compare_without_validation_prints_the_table_only(capsys):
    assert main(["compare", MLP, "--engine", "embedded", *MESH, "--rollouts", "100", "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert "| strategy | step time | peak per device | over memory | relative cost | search s |" in printed
    assert "XLA" not in printed


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "batch=16,model=8", "--validate"], "--validate: mesh batch=16,model=8 has 128 devices; host "
     "validation runs up to 64"),
    (["--mesh", "batch=4,model=2", "--rollouts", "0"], "argument --rollouts: 0: give 1 or more rollouts"),
    (["--mesh", "batch=4,model=2", "--roles", "no_such_roles.toml"], "no_such_roles.toml"),
])
def test_compare_bad_input(argv, message, tmp_path, capsys):
    out = tmp_path / "compare.json"
    assert main(["compare", MLP, "--engine", "embedded", "--workers", "1", "--json", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err
    assert not out.exists()
