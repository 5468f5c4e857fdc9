"""Kernel classes live in the rules: what one device runs an op as (``kernel_class`` in each op family file,
``custom_call_class`` per custom call target) is read back and priced with no Python table.

An op family a researcher adds is one ``.dl`` file: here a made-up custom call, ``@my_scale``, emitted the way
users emit one (``jax.ffi.ffi_call``), gets its identities and its class from a ``--rules`` folder and is
analyzed, priced and searched; without a class it is reported as unpriced and priced as a library call.
Expected costs are worked out by hand on a round-numbers profile (1e12 B/s, 1 us per kernel or library
call, 10 us per step).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import ONE_LEVEL, analysis_of, engines, round_numbers_profile

from toast import (
    Budget,
    CostModel,
    ShardingModel,
    SpaceSettings,
    ToastError,
    analyze,
    autoshard,
    load_hardware,
    parse_mesh,
)
from toast.analysis.kernel_semantics import KernelClass
from toast.cli import main
from toast.datalog.embedded import run_embedded_file
from toast.datalog.variants import assemble, load_variant
from toast.examples import EXAMPLES

N = 1024
MIB4 = 4 * N * N  # bytes of one [1024, 1024] f32 tensor
KERNEL = LIBRARY = 1e-6
STEP = 1e-5

IDENTITIES = """\
ruled_custom_call("my_scale").
ident(A, B, Op, __FILE__, __LINE__) :-
    custom_call_target(Op, "my_scale"), in_dim(Op, 0, Dim, B, Size), out_dim(Op, 0, Dim, A, Size).
"""
CLASSIFIED = IDENTITIES + 'custom_call_class("my_scale", "fusible").\n'


def my_scale_step(x, b):
    """A custom elementwise kernel of the user's, then an add."""
    return jax.ffi.ffi_call("my_scale", jax.ShapeDtypeStruct(x.shape, x.dtype))(x) + b


ARGS = [jax.ShapeDtypeStruct((N, N), jnp.float32)] * 2


@pytest.fixture(scope="module")
def unit(tmp_path_factory):
    path = tmp_path_factory.mktemp("hw") / "unit.toml"
    path.write_text(round_numbers_profile("unit", ONE_LEVEL))
    return load_hardware(str(path))


def _rules(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "my_scale.dl").write_text(text)
    return folder


def test_the_kernel_tables_are_read_back_by_kind():
    """A few rows of the family files, as the kernel plan reads them (the goldens hold them all)."""
    analysis = analysis_of(EXAMPLES["ops_zoo"])
    semantics = analysis.kernel_semantics
    assert (analysis.kernel_class["stablehlo.dot_general"], analysis.kernel_class["stablehlo.reshape"],
            analysis.kernel_class["stablehlo.add"], analysis.kernel_class["stablehlo.bitcast_convert"]) == (
        "matmul", "view", "fusible", "view")
    assert semantics.custom_call_class["Sharding"] == "view"
    assert semantics.in_place_update == {"stablehlo.dynamic_update_slice": (0, 1)}
    assert semantics.window_selection == {"stablehlo.select_and_scatter": (1, 2)}


@pytest.mark.parametrize("engine", engines())
def test_a_custom_call_of_the_users_is_classified_priced_and_searched_from_its_rule_file(engine, tmp_path, unit):
    rules = _rules(tmp_path, CLASSIFIED)
    analysis = analyze("my_scale", fn=my_scale_step, args=ARGS, engine=engine, rules=rules)
    assert analysis.unruled_ops == () and analysis.unpriced_ops == () and analysis.invalid == ()
    cost = CostModel(ShardingModel(analysis, parse_mesh("d=1")), unit).evaluate(
        ShardingModel(analysis, parse_mesh("d=1")).initial())
    # Fusible: one loop fusion reads x and b and writes the sum (the scaled x never exists in memory).
    assert cost.step_time_s == pytest.approx(3 * MIB4 / 1e12 + KERNEL + STEP)

    # A program this small has colors of a few names: let the search consider them all.
    strategy = autoshard(my_scale_step, *ARGS, mesh="d=4", hardware=unit, rules=rules, engine=engine,
                         budget=Budget(rollouts=200), space_settings=SpaceSettings(min_names=1))
    specs = strategy.partition_specs
    # x, b and the result split alike along d (either dim): a quarter of the bytes, no collective.
    assert specs["x"] == specs["b"] and "d" in tuple(specs["x"])
    assert strategy.cost["step_time_s"] == pytest.approx(3 * MIB4 / 4 / 1e12 + KERNEL + STEP)


@pytest.mark.parametrize("engine", engines())
def test_a_custom_call_without_a_class_is_reported_unpriced_and_priced_as_a_library_call(engine, tmp_path, unit):
    analysis = analyze("my_scale", fn=my_scale_step, args=ARGS, engine=engine, rules=_rules(tmp_path, IDENTITIES))
    assert analysis.unruled_ops == ()
    assert [u.kind for u in analysis.unpriced_ops] == ["stablehlo.custom_call @my_scale"]
    model = ShardingModel(analysis, parse_mesh("d=1"))
    cost = CostModel(model, unit).evaluate(model.initial())
    # A library call reads x and writes its result (2 x 4 MiB); a fusion reads it and b and writes the sum.
    assert cost.step_time_s == pytest.approx(5 * MIB4 / 1e12 + LIBRARY + KERNEL + STEP)


def test_toast_analyze_lists_unpriced_ops_beside_unruled_ones(tmp_path, capsys):
    text = jax.jit(my_scale_step).lower(*ARGS).as_text()
    program = tmp_path / "my_scale.mlir"
    program.write_text(text)
    assert main(["analyze", str(program), "--engine", "embedded"]) == 0
    bare = capsys.readouterr().out
    assert "unpriced ops (1, no kernel class" in bare and "stablehlo.custom_call @my_scale" in bare
    assert main(["analyze", str(program), "--engine", "embedded", "--rules", str(_rules(tmp_path, CLASSIFIED))]) == 0
    ruled = capsys.readouterr().out
    assert "unruled ops: none" in ruled and "unpriced ops: none" in ruled


def test_the_rules_known_classes_are_the_cost_models_vocabulary(tmp_path):
    """The rules' ``known_kernel_class`` rows (rules/nda.dl, read back by running the default rule program) are
    exactly ``KernelClass``, the classes the kernel plan names."""
    program = tmp_path / "program.dl"
    program.write_text(assemble(load_variant("default")).text)
    rows = run_embedded_file(program, {}, ["known_kernel_class"])["known_kernel_class"]
    assert sorted(rows) == sorted((str(c),) for c in KernelClass)
    assert len(rows) == 11


def test_an_unknown_class_is_refused_where_the_cost_model_reads_it(tmp_path, unit):
    """A rule giving a class no ``KernelClass`` names fails the rules' invariant; an analysis kept anyway
    (``check_invariants=False``) is refused, in one line naming the row, where its kernel plan reads the class (it
    was read as a class of no kernel: the call cost nothing)."""
    rules = _rules(tmp_path, IDENTITIES + 'custom_call_class("my_scale", "gpu_magic").\n')
    analysis = analyze("my_scale", fn=my_scale_step, args=ARGS, engine="embedded", rules=rules,
                       check_invariants=False)
    assert [(i.check, i.detail) for i in analysis.invalid] == [("kernel_class_unknown",
                                                                 "custom_call @my_scale: gpu_magic")]
    model = ShardingModel(analysis, parse_mesh("d=1"))
    with pytest.raises(ToastError) as raised:
        CostModel(model, unit)
    assert str(raised.value) == ("rules' custom_call_class(\"my_scale\", \"gpu_magic\"): unknown kernel class "
                                 "'gpu_magic' (the known ones: view, inline, loop, branch, terminator, matmul, "
                                 "library, reduction, scatter, cheap, fusible)")
