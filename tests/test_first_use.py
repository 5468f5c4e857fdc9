"""First use as a new user meets it (issue 11): sizing a factory from the command line, a
factory in the current directory, dims spelled as the summary prints them, units that fit,
mesh axes chosen by name, and an unknown factory listing the known ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from toast.cli import main


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_factory_keyword_arguments_size_the_program(capsys):
    assert main(["analyze", "toast.examples.gpt:gpt_small?layers=1", "--engine", "embedded"]) == 0
    one_layer = capsys.readouterr().out.splitlines()[0]
    assert main(["analyze", "toast.examples.gpt:gpt_small", "--arg", "layers=3", "--engine", "embedded"]) == 0
    three_layers = capsys.readouterr().out.splitlines()[0]
    assert main(["analyze", "toast.examples.gpt:gpt_small", "--engine", "embedded"]) == 0
    default = capsys.readouterr().out.splitlines()[0]
    ops = [int(line.split(": ")[1].split(" ops")[0]) for line in (one_layer, default, three_layers)]
    assert ops[0] < ops[1] < ops[2], ops  # 1, 2 (the default) and 3 layers
    assert ops[2] - ops[1] == ops[1] - ops[0]  # one layer's ops each time


def test_bad_factory_arguments_are_one_line(capsys):
    assert main(["analyze", "toast.examples.gpt:gpt_small?layers", "--engine", "embedded"]) == 2
    assert "should be NAME=VALUE" in _one_error_line(capsys)
    assert main(["analyze", "toast.examples.gpt:gpt_small", "--arg", "depth=3", "--engine", "embedded"]) == 2
    assert "cannot call the factory with {'depth': 3}" in _one_error_line(capsys)


def test_a_factory_in_the_current_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_model.py").write_text(
        "import jax, jax.numpy as jnp\n\n"
        "def model(*, width=8):\n"
        "    return (lambda x, w: jnp.tanh(x @ w)), (jax.ShapeDtypeStruct((4, width), jnp.float32),\n"
        "                                           jax.ShapeDtypeStruct((width, 2), jnp.float32))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["analyze", "my_model:model?width=16", "--engine", "embedded"]) == 0
    assert "colors" in capsys.readouterr().out


def test_an_unknown_factory_lists_the_known_ones(capsys):
    assert main(["analyze", "toast.examples.gpt:gpt", "--engine", "embedded"]) == 2
    line = _one_error_line(capsys)
    assert "has no function 'gpt'" in line
    assert all(name in line for name in ("gpt_small", "gpt_scan", "gpt_train_step"))


@pytest.mark.parametrize(("first", "second"), [("x[1]", "w1[0]"), ("x:1", "w1[0]"), ("x[1]", "w1:0")])
def test_explain_takes_dims_as_the_summary_prints_them(capsys, first, second):
    assert main(["explain", "toast.examples.mlp:mlp", first, second, "--engine", "embedded"]) == 0
    assert capsys.readouterr().out.startswith("x:1 and w1:0 share color")  # named the JSON's way


def test_explain_refuses_a_dim_in_neither_spelling_before_analyzing(capsys, monkeypatch):
    monkeypatch.setattr("toast.analysis.named_dimensions.analyze", lambda *a, **k: pytest.fail("analyzed"))
    assert main(["explain", "toast.examples.mlp:mlp", "x", "w1:0"]) == 2
    assert "should be VALUE:DIM or VALUE[DIM]" in _one_error_line(capsys)


def test_shard_prints_units_that_fit_and_says_what_relative_cost_is(capsys):
    assert main(["shard", "toast.examples.mlp:mlp", "--mesh", "batch=4,model=2", "--strategy", "megatron",
                 "--engine", "embedded"]) == 0
    out = capsys.readouterr().out
    # Megatron on the MLP, per device: x 256x32/4, w1 32x64/2, w2 64x16/2 as f32 and more: KiB, not 0.0 MiB.
    assert " KiB per device" in out and "0.0 MiB" not in out
    assert "relative cost " in out and "the step time over the unsharded program's" in out


def test_strategies_pick_mesh_axes_by_name(tmp_path, capsys):
    """``model=2,batch=4``: data parallelism runs over ``batch`` though it is the second axis."""
    path = tmp_path / "s.json"
    assert main(["shard", "toast.examples.mlp:mlp", "--mesh", "model=2,batch=4", "--strategy", "megatron",
                 "--engine", "embedded", "-o", str(path)]) == 0
    arguments = {a["name"]: a["partition_spec"] for a in json.loads(path.read_text())["arguments"]}
    assert arguments["x"] == ["batch", None]
    assert arguments["w1"] == [None, "model"]


def test_the_readmes_shard_example_runs(tmp_path, capsys):
    """The README's example: gpt_small has a batch of 2, so its mesh is batch=2,model=4."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    command = "toast shard toast.examples.gpt:gpt_small --mesh batch=2,model=4 --strategy megatron -o s.json"
    assert command in readme
    argv = command.split()[1:-1] + [str(tmp_path / "s.json"), "--engine", "embedded"]
    assert main(argv) == 0
    assert json.loads((tmp_path / "s.json").read_text())["mesh"]["axes"] == [["batch", 2], ["model", 4]]


def test_the_readme_quick_path_compares_every_strategy(capsys):
    """The README's second command: on gpt_small sized to a batch of 8, every manual strategy but the two
    whose roles both want `model` applies, and those two say so in the roles' terms."""
    assert main(["compare", "toast.examples.gpt:gpt_small?batch=8", "--mesh", "batch=4,model=2", "--engine",
                 "embedded", "--rollouts", "50", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| strategy")]
    applied = [row.split(" | ")[0][2:] for row in rows if "does not apply" not in row]
    assert applied == ["toast", "data_parallel", "megatron", "fsdp", "sequence", "fsdp+megatron", "fsdp+sequence",
                       "data_parallel_all", "fsdp_all", "maxtext"]
    assert ("| megatron+sequence, fsdp+megatron+sequence | - | - | - | does not apply: role 'sequence' on model: "
            in out)
    assert "(roles heads, mlp and sequence all want model)" in out and "color" not in out.split("| toast |")[1]


def test_strategies_that_do_not_apply_for_one_reason_are_one_row(capsys):
    assert main(["compare", "toast.examples.gpt:gpt_small", "--mesh", "batch=4,model=2", "--engine", "embedded",
                 "--rollouts", "20", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    # Three reasons, three rows: the batch of 2 on 4 devices (every strategy that splits the batch), the mesh's
    # two axes (fsdp_data_axes+megatron), the roles' missing experts (expert_parallel).
    assert sum("does not apply" in line for line in out.splitlines() if line.startswith("| ")) == 3
    assert ("| data_parallel, megatron, fsdp, sequence, fsdp+megatron, fsdp+sequence, megatron+sequence, "
            "fsdp+megatron+sequence, data_parallel_all, fsdp_all, maxtext | - | - | - | does not apply: role 'batch' "
            "on batch: tokens[0] has 2 elements, not divisible by the 4 devices of batch" in out)


def test_roles_lists_the_arguments_and_writes_the_proposed_roles(tmp_path, capsys):
    out = tmp_path / "gpt.roles.toml"
    assert main(["roles", "toast.examples.gpt:gpt_small", "--engine", "embedded", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "arguments of jit_train_step (38):" in printed
    assert "  tokens" in printed and "[2, 16] i32" in printed
    assert "params['wte']" in printed and "[128, 64] f32" in printed
    text = out.read_text()
    assert 'batch = ["tokens:0", "targets:0"]' in text and text in printed
    # The file is a roles file: shard reads it back.
    assert main(["shard", "toast.examples.gpt:gpt_small", "--mesh", "batch=2,model=4", "--strategy", "megatron",
                 "--roles", str(out), "--engine", "embedded"]) == 0


def test_analyze_prints_the_argument_names(capsys):
    assert main(["analyze", "toast.examples.mlp:mlp", "--engine", "embedded"]) == 0
    assert "arguments (3): x [256, 32] f32; w1 [32, 64] f32; w2 [64, 16] f32" in capsys.readouterr().out


def test_locations_are_the_users_lines_not_a_librarys():
    """explain, the unruled-op list and the buffers at the peak name the user's line: Equinox's layers are
    frames in site-packages, the ViT's own lines are the user's."""
    pytest.importorskip("equinox")
    from toast import analyze

    analysis = analyze("benchmarks.programs.equinox_vit:equinox_vit", engine="embedded")
    files = {value.loc.rpartition(":")[0] for value in analysis.program.values if value.loc}
    assert not [name for name in files if "site-packages" in name]
    assert any(name.endswith("benchmarks/programs/equinox_vit.py") for name in files)
