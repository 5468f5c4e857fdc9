"""Roles proposed from the analysis (toast.sharding.propose), checked against the roles files written by hand
for the bundled examples: a role names colors, so the proposal is right when it names the same colors."""

from __future__ import annotations

import pytest

import toast
from toast.cli import main
from toast.sharding.propose import PROPOSED_SOURCE, propose_roles
from toast.sharding.roles import load_roles, roles_for_input
from toast.sharding.strategies import role_colors


def _colors(analysis, roles, role):
    return set(role_colors(analysis, roles, role)) if roles.get(role) else set()


@pytest.mark.parametrize("spec, roles_spec, exact, contains", [
    # Inference MLP (Figure 2a): x is data (its dim 0 reaches the output), the weights are not.
    ("toast.examples.mlp:mlp", "toast.examples.mlp:mlp", ("batch", "heads", "mlp", "sequence"), ()),
    # GPT training step, 2 layers: every role as gpt.roles.toml names it (heads and MLP hidden of each layer).
    ("toast.examples.gpt:gpt_train_step?layers=2", "toast.examples.gpt:gpt_train_step",
     ("batch", "heads", "mlp", "sequence"), ()),
    # Gemma (GQA, GeGLU): the MLP colors of the file and the per-key-head colors Megatron may split too.
    ("toast.examples.gemma:gemma_small", "toast.examples.gemma:gemma_small", ("batch", "heads", "sequence"),
     ("mlp",)),
    # Inference with a KV cache: the cache is data too, split with the tokens.
    ("toast.examples.itx:itx_small", "toast.examples.itx:itx_small", ("batch",), ()),
])
def test_proposed_roles_name_the_colors_of_the_hand_written_roles(spec, roles_spec, exact, contains):
    analysis = toast.analyze(spec, engine="embedded")
    written = roles_for_input(roles_spec)
    proposed = propose_roles(analysis)
    assert proposed.source == PROPOSED_SOURCE
    for role in exact:
        assert _colors(analysis, proposed, role) == _colors(analysis, written, role), role
    for role in contains:
        assert _colors(analysis, written, role) <= _colors(analysis, proposed, role), role


def test_proposed_batch_of_an_inference_program_is_the_dim_that_reaches_the_output():
    """Two data-like float arguments: the batch is the dim 0 whose color is the result's dim 0."""
    import jax
    import jax.numpy as jnp

    def fn(w, x):  # the weight comes first, as in params-first APIs
        return jnp.tanh(x @ w)

    args = (jax.ShapeDtypeStruct((32, 64), jnp.float32), jax.ShapeDtypeStruct((16, 32), jnp.float32))
    roles = propose_roles(toast.analyze("fn", fn=fn, args=args, engine="embedded"))
    assert roles.get("batch") == (("x", 0),)
    assert not roles.get("mlp") and not roles.get("heads")  # w's dims: one contracted with data, one output


def test_roles_written_as_toml_read_back_equal(tmp_path):
    roles = propose_roles(toast.analyze("toast.examples.gpt:gpt_train_step?layers=2", engine="embedded"))
    path = tmp_path / "gpt.roles.toml"
    path.write_text(roles.to_toml())
    assert load_roles(path).dims == roles.dims


def test_cli_writes_the_proposed_roles_and_compare_uses_them(tmp_path, capsys, monkeypatch):
    """A module with no roles file beside it: compare prices the manual strategies of the proposed roles."""
    import shutil
    from pathlib import Path

    import toast.examples.mlp as example

    shutil.copy(Path(example.__file__), tmp_path / "user_mlp.py")
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "user_mlp:mlp", "--propose-roles", "roles.toml"]) == 0
    assert load_roles(tmp_path / "roles.toml").dims == {"batch": (("x", 0),), "mlp": (("w1", 1),)}
    capsys.readouterr()
    assert main(["compare", "user_mlp:mlp", "--mesh", "batch=4,model=2", "--rollouts", "50", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"roles: {PROPOSED_SOURCE}: batch x:0; mlp w1:1" in out
    megatron = next(line for line in out.splitlines() if line.startswith("| megatron |"))
    assert "does not apply" not in megatron


def test_two_outputs_on_one_path_are_refused_before_the_analysis(tmp_path, capsys):
    path = str(tmp_path / "same.toml")
    assert main(["analyze", "toast.examples.mlp:mlp", "--json", path, "--propose-roles", path]) == 2
    err = capsys.readouterr().err
    assert f"--json and --propose-roles both name {path}" in err and err.count("\n") == 1
    assert not (tmp_path / "same.toml").exists()
