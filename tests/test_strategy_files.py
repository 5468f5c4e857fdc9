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
