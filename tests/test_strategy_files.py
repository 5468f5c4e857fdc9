"""One reader checks a strategy file for every consumer against the published JSON Schema, and
the analysis JSON conforms to its schema."""

from __future__ import annotations

import json

import pytest

import toast
from toast.cli import main
from toast.examples.mlp import mlp
from toast.output.strategy_file import schema_problem

MLP = "toast.examples.mlp:mlp"


@pytest.fixture(scope="module")
def strategy(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("strategy") / "s.json"
    assert main(["shard", MLP, "--mesh", "batch=4,model=2", "--strategy", "megatron", "--engine", "embedded",
                 "-o", str(path)]) == 0
    return json.loads(path.read_text())


def test_written_files_conform_to_the_published_schemas(strategy):
    assert schema_problem(strategy, "strategy") == ""
    assert schema_problem(toast.to_json(toast.analyze(MLP, engine="embedded")), "analysis") == ""


def _broken(strategy: dict, edit) -> dict:
    document = json.loads(json.dumps(strategy))
    edit(document)
    return document


EDITS = {
    "no arguments": (lambda d: d.pop("arguments"), "'arguments' is a required property"),
    "no fingerprint": (lambda d: d.pop("fingerprint"), "'fingerprint' is a required property"),
    "axis not in the mesh": (lambda d: d["arguments"][0].update(partition_spec=["data", None]),
                             "names mesh axis 'data', which the mesh"),
    "axis used twice": (lambda d: d["arguments"][1].update(partition_spec=["model", "model"]),
                        "uses a mesh axis twice"),
    "mesh size not a number": (lambda d: d["mesh"].update(axes=[["batch", "four"]]), "is not of type 'integer'"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_every_consumer_refuses_a_broken_file_in_one_line(edit, strategy, tmp_path, capsys):
    change, message = EDITS[edit]
    document = _broken(strategy, change)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(document))
    assert main(["validate", MLP, str(path), "--engine", "embedded", "--devices", "8"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    fn, args = mlp()
    for given in (path, document):  # a path and an already loaded document alike
        with pytest.raises(toast.ToastError, match=message.replace("(", r"\(").replace("[", r"\[")):
            toast.sharded_jit(given, fn, args)


def _with_state(document: dict, edit) -> None:
    import base64
    import zlib

    import numpy as np

    masks = np.frombuffer(zlib.decompress(base64.b64decode(document["state"]["masks"])), dtype=np.uint8).copy()
    edit(masks)
    document["state"]["masks"] = base64.b64encode(zlib.compress(masks.tobytes())).decode("ascii")


TAMPERED = {
    # A valid spec that is not the state's: `apply` would run it, `validate` would check the state.
    "edited spec": (lambda d: d["arguments"][0].update(partition_spec=["model", None]),
                    "arguments[0] (x): partition_spec [\"model\", null] does not match the file's state and program "
                    "([\"batch\", null]); was the file edited?"),
    "edited result spec": (lambda d: d["results"][0].update(partition_spec=[None, None]),
                           "results[0] (result): partition_spec [null, null] does not match"),
    "edited shape": (lambda d: d["arguments"][1].update(shape=[32, 32]), "arguments[1] (w1): shape [32, 32] does "
                     "not match"),
    # x's dims 0 and 1 both on batch: no sharding; the state must not reach XLA or the cost model.
    "invalid state": (lambda d: _with_state(d, lambda masks: masks.__setitem__(1, masks[0])),
                      "the state is not a valid sharding (x: one mesh axis shards two of its dims)"),
}


@pytest.mark.parametrize("edit", sorted(TAMPERED))
def test_validate_and_cost_refuse_a_file_whose_state_and_specs_disagree(edit, strategy, tmp_path, capsys):
    change, message = TAMPERED[edit]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_broken(strategy, change)))
    assert main(["validate", MLP, str(path), "--engine", "embedded", "--devices", "8"]) == 2
    assert main(["cost", MLP, "--strategy", str(path), "--hardware", "a100_80gb", "--engine", "embedded"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(message in line for line in lines), lines


def test_a_spec_that_does_not_divide_its_dim_is_refused_by_every_reader(strategy, tmp_path):
    document = _broken(strategy, lambda d: d["arguments"][0].update(shape=[255, 32]))
    fn, args = mlp()
    with pytest.raises(toast.ToastError, match=r"arguments\[0\] \(x\): dim 0 of size 255 is not divisible by the 4 "
                                               "devices of batch"):
        toast.sharded_jit(document, fn, args)


def test_a_strategy_made_with_a_custom_profile_validates_without_the_profile_file(tmp_path, capsys):
    from toast.resources import resource_dir

    profile = tmp_path / "my_gpu.toml"
    text = (resource_dir("hardware") / "h100.toml").read_text().replace('name = "h100"', 'name = "my_gpu"', 1)
    assert 'name = "my_gpu"' in text
    profile.write_text(text)
    path = tmp_path / "s.json"
    assert main(["shard", MLP, "--mesh", "batch=4,model=2", "--strategy", "megatron", "--engine", "embedded",
                 "--hardware", str(profile), "-o", str(path)]) == 0
    document = json.loads(path.read_text())
    assert document["hardware"] == "my_gpu" and document["hardware_profile"] == text
    profile.unlink()
    capsys.readouterr()
    assert main(["validate", MLP, str(path), "--engine", "embedded", "--devices", "8"]) == 0, capsys.readouterr().err
    assert "numerics: match" in capsys.readouterr().out
