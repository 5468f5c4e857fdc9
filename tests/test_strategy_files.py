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
    # megatron's one collective: the all-reduce over model of the result, f32[256, 16] with rows on batch=4.
    "dropped collective": (lambda d: d["collectives"].pop(), "0 collectives, the state needs 1 on mesh "
                           "batch=4,model=2; was the file edited?"),
    "edited collective kind": (lambda d: d["collectives"][0].update(kind="all-to-all"), "collectives[0] (all-to-all "
                               "over model) is not what the state needs on mesh batch=4,model=2 (the all-reduce of "
                               "result over model)"),
    "edited collective bytes": (lambda d: d["collectives"][0].update(bytes_out=1), "collectives[0] (the all-reduce "
                                "of result over model) gives 4096 bytes per device on this mesh, the file says 1"),
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


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_json_does_not_have_is_refused_in_one_line(constant, strategy, tmp_path, capsys):
    """Python's ``json`` reads ``NaN`` and ``Infinity`` (and ``1e999`` as infinity); JSON has none, and a NaN
    cost compares false with everything."""
    lines = json.dumps(strategy, indent=1).splitlines()
    row = next(k for k, line in enumerate(lines) if '"step_time_s":' in line)
    lines[row] = lines[row].split(":")[0] + f": {constant},"
    path = tmp_path / "s.json"
    path.write_text("\n".join(lines) + "\n")
    column = lines[row].index(constant) + 1
    if constant == "1e999":  # a JSON number, past float's range
        message = f"{path}: not a strategy file: cost.step_time_s is not a finite number (costs and sizes are)"
    else:
        message = f"{path}:{row + 1}:{column}: not a strategy file (invalid JSON: {constant} is not a JSON number)"
    assert main(["validate", MLP, str(path), "--engine", "embedded", "--devices", "8"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"toast: error: {message}"]
    with pytest.raises(toast.ToastError) as caught:
        toast.load_strategy(path)
    assert str(caught.value) == message


def test_a_loaded_document_with_a_nan_is_refused(strategy):
    document = _broken(strategy, lambda d: d["cost"].update(relative=float("nan")))
    fn, args = mlp()
    for call in (lambda: toast.load_strategy(document), lambda: toast.sharded_jit(document, fn, args)):
        with pytest.raises(toast.ToastError) as caught:
            call()
        assert str(caught.value) == ("strategy: not a strategy file: cost.relative is not a finite number (costs and "
                                     "sizes are)")


def _mesh_edited(strategy_name: str, folder) -> str:
    """A strategy written for batch=2,model=4 whose mesh was then edited to batch=4,model=2: the same axes, so
    the state and the specs stay valid; only what the sizes imply (the collectives' bytes) tells."""
    path = folder / f"{strategy_name}.json"
    assert main(["shard", MLP, "--mesh", "batch=2,model=4", "--strategy", strategy_name, "--engine", "embedded",
                 "-o", str(path)]) == 0
    document = json.loads(path.read_text())
    document["mesh"]["axes"] = [["batch", 4], ["model", 2]]
    path.write_text(json.dumps(document))
    return str(path)


def test_an_edited_mesh_is_refused_by_validate_and_cost(tmp_path, capsys):
    """megatron's one collective is the all-reduce over model of the result (f32[256, 16], rows on batch): 256/2 *
    16 * 4 = 8192 bytes per device on batch=2, 256/4 * 16 * 4 = 4096 on batch=4."""
    path = _mesh_edited("megatron", tmp_path)
    capsys.readouterr()
    assert main(["validate", MLP, path, "--engine", "embedded", "--devices", "8"]) == 2
    assert main(["cost", MLP, "--strategy", path, "--hardware", "a100_80gb", "--engine", "embedded"]) == 2
    message = (f"toast: error: {path}: the mesh batch=4,model=2 does not match the strategy's state: collectives[0] "
               "(the all-reduce of result over model) moves 4096 bytes per device on this mesh, the file says 8192; "
               "was the mesh edited? Write the file again on the mesh you want (`toast shard -o` or "
               "`toast autoshard -o`)")
    assert capsys.readouterr().err.strip().splitlines() == [message, message]


def test_an_edited_mesh_is_refused_by_every_reader_where_a_gather_tells(tmp_path, capsys):
    """fsdp+megatron all-gathers w1 (f32[32, 64]: rows on batch, columns on model) over batch: 32/2 * 64/4 * 4 =
    1024 bytes per device to 2048, a ratio of 2, which batch=4 contradicts without the program."""
    path = _mesh_edited("fsdp+megatron", tmp_path)
    capsys.readouterr()
    message = (f"{path}: the mesh batch=4,model=2 does not match the strategy's collectives: collectives[1] "
               "(all-gather over batch) takes 1024 bytes per device to 2048, not a ratio of 4 devices; was the mesh "
               "edited? Write the file again on the mesh you want (`toast shard -o` or `toast autoshard -o`)")
    assert main(["validate", MLP, path, "--engine", "embedded", "--devices", "8"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"toast: error: {message}"]
    fn, args = mlp()
    for call in (lambda: toast.load_strategy(path), lambda: toast.sharded_jit(path, fn, args)):
        with pytest.raises(toast.ToastError) as caught:
            call()
        assert str(caught.value) == message


_MANY_ARGUMENTS = '''
import jax
import jax.numpy as jnp


def many_inputs(count: int = 30):
    def fn(xs, w):
        return sum(jnp.tanh(x @ w) for x in xs)

    xs = [jax.ShapeDtypeStruct((64, 16), jnp.float32) for _ in range(count)]
    return fn, (xs, jax.ShapeDtypeStruct((16, 16), jnp.float32))
'''


@pytest.mark.parametrize("written", [True, False])
def test_autoshard_prints_the_first_shardings_and_says_where_the_rest_are(written, tmp_path, monkeypatch, capsys):
    """A program of many arguments (a T5 has ~1,200) gets ``SHOWN_ARGUMENTS`` (10) sharding lines before the table,
    then how many more there are and where: the ``-o`` file has every one. The 30 inputs share their batch dim's
    color (their products are summed), so all 30 are sharded or none."""
    import re

    (tmp_path / "many_arguments_program.py").write_text(_MANY_ARGUMENTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "s.json"
    command = ["autoshard", "many_arguments_program:many_inputs", "--mesh", "batch=2,model=2", "--engine", "embedded",
               "--rollouts", "20", "--workers", "1"]
    assert main(command + (["-o", str(out)] if written else [])) == 0
    printed = capsys.readouterr().out.splitlines()
    shardings = [line for line in printed if re.match(r"  xs\[\d+\]: \[", line)]
    assert [line.split(":")[0] for line in shardings] == [f"  xs[{k}]" for k in range(10)]
    where = f"all in {out}" if written else "write them all with -o FILE"
    assert f"  ... 20 more sharded arguments ({where})" in printed
    assert printed.index(f"  ... 20 more sharded arguments ({where})") + 1 == printed.index(
        "| strategy | step time | peak per device | over memory | relative cost |")
    if written:
        arguments = json.loads(out.read_text())["arguments"]
        assert sum(any(entry is not None for entry in a["partition_spec"]) for a in arguments) == 30
