"""Roles as data: manual strategies on a user's own program (a ``.mlir`` file and a roles file
written here, not a bundled example), the ``--batch ARG:DIM`` hint, the roles file beside a
``module:function``'s module, and one clear line for each kind of bad roles input.

The expected ``PartitionSpec``s are written out by hand from the program below; ``toast
validate`` runs each strategy with XLA on 8 host CPU devices and compares the outputs with
the unsharded program's.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import jax
import pytest
from conftest import analysis_of

import toast.analysis.named_dimensions
from toast import STRATEGIES, ShardingModel, ToastError, manual_strategy, parse_mesh
from toast.cli import main
from toast.sharding import Roles, load_roles, roles_for_input

MODULE = "toast_test_user_model"  # the user's module, written to a temporary directory

# A user's training step: one attention block (softmax over the keys, whose scores have the
# sequence dim twice: a sharding conflict) and an MLP, a loss, gradients and an SGD update.
PROGRAM = '''
import jax
import jax.numpy as jnp

B, S, D, F = 2, 8, 16, 32  # batch, sequence, model width, MLP width


def step(params, x):
    def loss_fn(p):
        q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]  # [B, S, D]
        scores = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(D)  # [B, S, S]
        h = x + jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores), v) @ p["wo"]
        out = h + jax.nn.relu(h @ p["w1"]) @ p["w2"]
        return jnp.mean(out ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return loss, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)


def factory():
    shapes = {"wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D), "w1": (D, F), "w2": (F, D)}
    params = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in shapes.items()}
    return step, (params, jax.ShapeDtypeStruct((B, S, D), jnp.float32))
'''

ROLES = """\
[roles]
batch = ["x:0"]
sequence = "x:1"
heads = ["params['wq']:1", "params['wv']:1"]  # wk:1 has wq:1's color (the scores contract them)
mlp = ["params['w1']:1"]
"""

MESH = ["--mesh", "batch=2,model=4"]
REPLICATED = {"params['wq']": [None, None], "params['wk']": [None, None], "params['wv']": [None, None],
              "params['wo']": [None, None], "params['w1']": [None, None], "params['w2']": [None, None]}
EXPECTED_SPECS = {
    "data_parallel": {**REPLICATED, "x": ["batch", None, None]},
    "megatron": {"params['wq']": [None, "model"], "params['wk']": [None, "model"], "params['wv']": [None, "model"],
                 "params['wo']": ["model", None], "params['w1']": [None, "model"], "params['w2']": ["model", None],
                 "x": ["batch", None, None]},
    # ZeRO-3 over batch on each parameter's largest dim (the first of equals); x is data, not a parameter.
    "fsdp": {"params['wq']": ["batch", None], "params['wk']": ["batch", None], "params['wv']": ["batch", None],
             "params['wo']": ["batch", None], "params['w1']": [None, "batch"], "params['w2']": ["batch", None],
             "x": ["batch", None, None]},
    "sequence": {**REPLICATED, "x": ["batch", "model", None]},
}


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> SimpleNamespace:
    """The user's files: ``step.mlir`` (lowered with debug info, so arguments keep their names),
    ``roles.toml``, and the module with the same roles beside it as ``<module>.roles.toml``."""
    directory = tmp_path_factory.mktemp("user")
    source = directory / f"{MODULE}.py"
    source.write_text(PROGRAM)
    (directory / f"{MODULE}.roles.toml").write_text(ROLES)
    roles = directory / "roles.toml"
    roles.write_text(ROLES)
    spec = importlib.util.spec_from_file_location(MODULE, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn, args = module.factory()
    mlir = directory / "step.mlir"
    mlir.write_text(jax.jit(fn).lower(*args).as_text(debug_info=True))
    return SimpleNamespace(directory=directory, mlir=str(mlir), roles=str(roles))


def _specs(path: Path) -> dict[str, list]:
    return {a["name"]: a["partition_spec"] for a in json.loads(path.read_text())["arguments"]}


def _validates(mlir: str, strategy: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["validate", mlir, str(strategy), "--engine", "embedded", "--devices", "8"]) == 0
    assert "numerics: match" in capsys.readouterr().out


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("toast: error: ")
    return err[0]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategies_on_a_users_program_pass_validate(strategy, user, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["shard", user.mlir, "--engine", "embedded", *MESH, "--roles", user.roles, "--strategy", strategy,
                 "-o", str(out)]) == 0
    assert f"roles from {user.roles}" in capsys.readouterr().out
    assert _specs(out) == EXPECTED_SPECS[strategy]
    _validates(user.mlir, out, capsys)


def test_data_parallel_from_the_batch_hint_alone(user, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["shard", user.mlir, "--engine", "embedded", *MESH, "--batch", "x:0", "-o", str(out)]) == 0
    assert "roles from --batch x:0" in capsys.readouterr().out
    assert _specs(out) == EXPECTED_SPECS["data_parallel"]
    _validates(user.mlir, out, capsys)


def test_the_roles_file_beside_a_users_module(user, tmp_path, monkeypatch, capsys):
    """``module:function`` input: ``<module>.roles.toml`` beside the module, no flag needed."""
    monkeypatch.syspath_prepend(str(user.directory))
    out = tmp_path / "s.json"
    assert main(["shard", f"{MODULE}:factory", "--engine", "embedded", *MESH, "--strategy", "megatron",
                 "-o", str(out)]) == 0
    assert f"{MODULE}.roles.toml" in capsys.readouterr().out
    assert _specs(out) == EXPECTED_SPECS["megatron"]


def test_a_roles_file_naming_no_argument(user, tmp_path, capsys):
    roles, out = tmp_path / "gpt_roles.toml", tmp_path / "s.json"
    roles.write_text('[roles]\nbatch = ["tokens:0"]\nheads = ["params[\'blocks\'][*][\'wq\']:1"]\n')
    assert main(["shard", user.mlir, "--engine", "embedded", *MESH, "--roles", str(roles), "--strategy", "megatron",
                 "-o", str(out)]) == 2
    line = _one_error_line(capsys)
    assert f"{roles}: no entry names an argument dim of jit_step" in line
    assert "x (2x8x16)" in line and "params['w1'] (16x32)" in line  # what the user can name instead
    assert not out.exists()


def test_a_role_naming_no_argument(user, tmp_path, capsys):
    roles = tmp_path / "roles.toml"
    roles.write_text('[roles]\nbatch = ["x:0"]\nmlp = ["params[\'w3\']:1"]\n')
    assert main(["shard", user.mlir, "--engine", "embedded", *MESH, "--roles", str(roles), "--strategy",
                 "megatron"]) == 2
    assert f"{roles}: role 'mlp' names no argument dim of jit_step" in _one_error_line(capsys)


@pytest.mark.parametrize("content, argv, message", [
    ('[roles]\nbatch = ["x:0"]\nheads = \n', [], "{roles}:3:9: malformed roles file: Invalid value"),
    ('[roles]\nbatch = ["x:0"]\n[extra]\n', [], "{roles}: unknown key 'extra'"),
    ('batch = ["x:0"]\n', [], "{roles}: unknown key 'batch'; a roles file has one [roles] table"),
    ('[roles]\nbatches = ["x:0"]\n', [],
     "{roles}: unknown role 'batches' (known: batch, heads, mlp, sequence, experts)"),
    ('[roles]\nbatch = ["x"]\n', [], "{roles}: role 'batch': 'x' should be NAME:DIM"),
    ('[roles]\nbatch = ["x:first"]\n', [], "{roles}: role 'batch': 'x:first': dim 'first' is not an integer >= 0"),
    ('[roles]\nbatch = ["x:-1"]\n', [], "dim '-1' is not an integer >= 0"),
    ('[roles]\nbatch = [0]\n', [], "{roles}: role 'batch' should be a list of \"NAME:DIM\" strings"),
    ('[roles]\nbatch = ["x:0"]\n', ["--strategy", "megatron"],
     "strategy 'megatron' needs role 'heads' or 'mlp', which {roles} does not name; give it in --roles FILE"),
    ('[roles]\nbatch = ["x:0"]\n', ["--strategy", "sequence"], "strategy 'sequence' needs role 'sequence'"),
    ('[roles]\nmlp = ["params[\'w1\']:1"]\n', ["--strategy", "fsdp"],
     "strategy 'fsdp' needs role 'batch', which {roles} does not name; give it in --roles FILE or --batch ARG:DIM"),
    (None, ["--batch", "x"], "--batch: 'x' should be NAME:DIM, e.g. x:0"),
    (None, ["--batch", "x:0.5"], "--batch: 'x:0.5': dim '0.5' is not an integer >= 0"),
    (None, ["--roles", "no_such.toml"], "no_such.toml: no such roles file"),
    (None, ["--batch", "x:0", "--strategy", "megatron"], "needs role 'heads' or 'mlp', which --batch x:0 does not"),
])
def test_bad_roles_fail_in_one_line_before_the_analysis(content, argv, message, user, tmp_path, monkeypatch,
                                                         capsys):
    def no_analysis(*_args, **_kwargs):
        raise AssertionError("the analysis ran")

    monkeypatch.setattr(toast.analysis.named_dimensions, "analyze", no_analysis)
    roles, out = tmp_path / "roles.toml", tmp_path / "s.json"
    if content is not None:
        roles.write_text(content)
        argv = ["--roles", str(roles), *argv]
    assert main(["shard", user.mlir, *MESH, "-o", str(out), *argv]) == 2
    assert message.format(roles=roles, mlir=user.mlir) in _one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("strategy", ["data_parallel", "megatron", "fsdp"])
def test_without_roles_a_strategy_uses_roles_proposed_from_the_analysis(strategy, user, tmp_path, capsys):
    """No roles file and no ``--batch``: ``toast shard`` and ``toast cost`` propose roles from the analysis
    and say so. Batch: ``x``'s dim 0 (the float input no update returns); mlp: ``w1``'s dim 1, which only the
    ``@ w2`` contraction sums. No heads: this attention has one head, and the dim the file calls heads
    (``wq``'s dim 1) is summed by ``q @ k``; so Megatron splits the MLP alone."""
    out = tmp_path / "s.json"
    assert main(["shard", user.mlir, "--engine", "embedded", *MESH, "--strategy", strategy, "-o", str(out)]) == 0
    assert "roles proposed from the analysis: batch x:0" in capsys.readouterr().out
    expected = EXPECTED_SPECS[strategy] if strategy != "megatron" else {
        **REPLICATED, "params['w1']": [None, "model"], "params['w2']": ["model", None], "x": ["batch", None, None]}
    assert _specs(out) == expected
    assert main(["cost", user.mlir, "--engine", "embedded", *MESH, "--strategy", strategy, "--hardware",
                 "h100"]) == 0
    assert f"strategy {strategy} (roles proposed from the analysis: batch x:0" in capsys.readouterr().out


def test_proposed_roles_that_lack_a_role_fail_in_one_line(user, tmp_path, capsys):
    """The user's program has no integer input to propose a sequence dim from: one line, nothing written."""
    out = tmp_path / "s.json"
    assert main(["shard", user.mlir, "--engine", "embedded", *MESH, "--strategy", "sequence", "-o", str(out)]) == 2
    assert ("strategy 'sequence' needs role 'sequence'; the roles proposed from the analysis lack it; give it in "
            "--roles FILE") in _one_error_line(capsys)
    assert not out.exists()


def test_bundled_examples_need_no_roles_flag(tmp_path, capsys):
    """``toast/examples/gpt.roles.toml`` and ``mlp.roles.toml`` ship beside their modules."""
    assert main(["shard", "toast.examples.gpt:gpt_small", "--engine", "embedded", *MESH, "--strategy",
                 "megatron"]) == 0
    out = capsys.readouterr().out
    assert "gpt.roles.toml" in out and "all-reduce over model" in out
    # --batch replaces the file's batch role and keeps its others (mlp: w1's hidden dim).
    strategy = tmp_path / "s.json"
    assert main(["shard", "toast.examples.mlp:mlp", "--engine", "embedded", "--mesh", "batch=4,model=2",
                 "--strategy", "megatron", "--batch", "x:1", "-o", str(strategy)]) == 0
    assert "mlp.roles.toml with --batch x:1" in capsys.readouterr().out
    assert _specs(strategy) == {"x": [None, "batch"], "w1": ["batch", "model"], "w2": ["model", None]}


def test_roles_in_python():
    """``Roles`` built in Python act like the shipped file; bad roles are one-line errors."""
    model = ShardingModel(analysis_of("toast.examples.mlp:mlp"), parse_mesh("batch=4,model=2"))
    shipped = roles_for_input("toast.examples.mlp:mlp")
    assert dict(shipped.dims) == {"batch": (("x", 0),), "mlp": (("w1", 1),)}
    state, _ = manual_strategy(model, "megatron", Roles({"batch": [("x", 0)], "mlp": [("w1", 1)]}))
    assert state.key() == manual_strategy(model, "megatron", shipped)[0].key()
    with pytest.raises(ToastError, match="unknown role 'hidden'"):
        Roles({"hidden": [("w1", 1)]})
    with pytest.raises(ToastError, match=r"\('w1', -1\) is not \(argument name, dim >= 0\)"):
        Roles({"mlp": [("w1", -1)]})
    gpt = load_roles(Path(toast.__file__).parent / "examples" / "gpt.roles.toml")
    assert set(gpt.dims) == {"batch", "sequence", "heads", "mlp"}
    assert gpt.get("heads")[0] == ("params['blocks'][*]['wq']", 1)
