"""The AutoParallel benchmark's translation of DTensor placements into toast pins (bench_autoparallel.py):
pure functions, no torch or AutoParallel needed. Expected values worked out by hand from DTensor's rule (mesh dim
``m``'s ``Shard(d)`` splits tensor dim ``d`` over mesh axis ``m``; several mesh dims on one tensor dim split it
major to minor in mesh order)."""

from __future__ import annotations

import pytest

from benchmarks.bench_autoparallel import partition_spec, split_kinds, state_dict_name, translate

AXES = ("batch", "model")


@pytest.mark.parametrize(("placements", "rank", "expected"), [
    (("R", "R"), 2, (None, None)),
    (("S(0)", "R"), 2, ("batch", None)),
    (("R", "S(1)"), 2, (None, "model")),
    (("S(1)", "S(0)"), 2, ("model", "batch")),  # each mesh axis on its own dim
    (("S(0)", "S(0)"), 2, (("batch", "model"), None)),  # FSDP over all 8 devices: one dim, mesh order
    (("S(0)", "P"), 1, ("batch",)),  # a partial (never on a parameter) adds no split
    (("R", "S(-1)"), 3, (None, None, "model")),  # a negative dim counts from the last
])
def test_partition_spec(placements, rank, expected):
    assert partition_spec(placements, AXES, rank) == expected


@pytest.mark.parametrize(("placements", "rank"), [(("S(0)",), 2), (("S(2)", "R"), 2), (("Shard0", "R"), 2)])
def test_partition_spec_refuses(placements, rank):
    with pytest.raises(ValueError):
        partition_spec(placements, AXES, rank)


@pytest.mark.parametrize(("argument", "expected"), [
    ("params['model']['layers'][1]['self_attn']['q_proj']['weight']", "model.layers.1.self_attn.q_proj.weight"),
    ("params['lm_head']['weight']", "lm_head.weight"),
    ("opt_state[0].mu['model']['norm']['weight']", "model.norm.weight"),
    ("opt_state[0].nu['model']['layers'][10]['mlp']['up_proj']['weight']", "model.layers.10.mlp.up_proj.weight"),
    ("opt_state[0].count", None),
    ("input_ids", None),
])
def test_state_dict_name(argument, expected):
    assert state_dict_name(argument) == expected


@pytest.mark.parametrize(("stored", "used", "expected"), [
    (("S(0)", "S(0)"), [("R", "R")], (["R", "R"], ["S(0)", "S(0)"])),  # FSDP on both axes: gathered for use
    (("S(0)", "S(0)"), [("R", "S(0)")], (["R", "S(0)"], ["S(0)", "R"])),  # FSDP on batch, Megatron on model
    (("R", "S(1)"), [("R", "S(1)"), ("R", "S(1)")], (["R", "S(1)"], ["R", "R"])),  # every user keeps it
    (("R", "S(1)"), [("R", "S(1)"), ("R", "R")], (["R", "R"], ["R", "S(1)"])),  # one user gathers it
    (("S(0)", "R"), None, (["S(0)", "R"], ["R", "R"])),  # users unknown: computed split
])
def test_split_kinds(stored, used, expected):
    assert split_kinds(stored, used) == expected


def test_translate_gives_parameters_and_their_optimizer_state_one_spec():
    arguments = [("params['lm_head']['weight']", 2), ("opt_state[0].count", 0),
                 ("opt_state[0].mu['lm_head']['weight']", 2), ("opt_state[0].nu['lm_head']['weight']", 2),
                 ("input_ids", 2)]
    pins, stored, unplaced = translate(arguments, {"lm_head.weight": ["R", "S(0)"]}, {"input_ids": ["S(0)", "R"]},
                                       AXES)
    assert pins == {"params['lm_head']['weight']": ("model", None),
                    "opt_state[0].mu['lm_head']['weight']": ("model", None),
                    "opt_state[0].nu['lm_head']['weight']": ("model", None),
                    "input_ids": ("batch", None)}
    assert stored == {}
    assert unplaced == ["opt_state[0].count"]


def test_translate_keeps_fsdp_splits_apart():
    arguments = [("params['model']['norm']['weight']", 1), ("opt_state[0].mu['model']['norm']['weight']", 1)]
    pins, stored, _ = translate(arguments, {"model.norm.weight": ["S(0)", "S(0)"]}, {}, AXES,
                                used={"model.norm.weight": [["R", "R"]]})
    assert pins == {"params['model']['norm']['weight']": (None,),
                    "opt_state[0].mu['model']['norm']['weight']": (None,)}
    assert stored == {"params['model']['norm']['weight']": (("batch", "model"),),
                      "opt_state[0].mu['model']['norm']['weight']": (("batch", "model"),)}
