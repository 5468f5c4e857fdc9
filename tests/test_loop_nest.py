"""The loop structure of a program, found once (``toast.frontend.loops.loop_nest``) and read by every stage that
reasons about loops: the analysis's dimension graph, the stored split through loops, the kernel plan and the
pricing of loop-body collectives.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from toast import CostModel, Roles, ShardingModel, analyze, load_hardware, manual_strategy, parse_mesh
from toast.frontend import loops
from toast.frontend.loops import loop_nest

LAYERS, STEPS, WIDTH, BATCH = 3, 2, 16, 8


def _nested(x, ws):
    """A scan over ``LAYERS`` layers, each ``STEPS`` iterations of ``h = tanh(h @ w)`` (a ``fori_loop``), then
    a ``while_loop`` whose trip count depends on the data."""
    def layer(h, w):
        return jax.lax.fori_loop(0, STEPS, lambda i, h: jnp.tanh(h @ w), h), None

    h, _ = jax.lax.scan(layer, x, ws)
    return jax.lax.while_loop(lambda h: jnp.sum(h) < 100.0, lambda h: h * 2.0, h)


ARGS = (jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32), jax.ShapeDtypeStruct((LAYERS, WIDTH, WIDTH), jnp.float32))


def test_the_loops_of_a_program_nest_with_their_trip_counts():
    """Three whiles in program order: the scan (3 layers), the fori_loop in its body (2 steps, 6 runs of its body
    per step) and the data-dependent while (its count unknown: once). The matmul runs in the inner body, so in
    each of those 6 runs; the scan's body block arguments are its counter, h and the stacked weights."""
    program = analyze("nested", fn=_nested, args=ARGS, engine="embedded").program
    nest = loop_nest(program)
    scan, inner, data = nest.loops
    assert [(loop.trip_count, loop.trip_count_known, loop.enclosing) for loop in nest.loops.values()] == [
        (LAYERS, True, -1), (STEPS, True, scan), (1, False, -1)]
    (dot,) = [op for op in program.ops if op.kind == "stablehlo.dot_general"]
    assert (nest.enclosing_loop(dot.id), nest.outermost_loop(dot.id)) == (inner, scan)
    assert int(nest.repeats_of_op[dot.id]) == nest.repeats_in(inner) == LAYERS * STEPS
    assert nest.chain(inner) == [inner, scan, -1]
    # jax carries the scanned stack first, then the counter and h.
    assert [program.values[v].shape for v in nest.loops[scan].body_args] == [(LAYERS, WIDTH, WIDTH), (),
                                                                              (BATCH, WIDTH)]
    # Definitions: the body's block arguments inside their while, its results outside it, arguments at the top.
    assert {int(nest.loop_of_value[v]) for v in nest.loops[inner].body_args} == {inner}
    assert [int(nest.loop_of_value[v]) for v in program.ops[inner].results] == [scan] * len(
        program.ops[inner].results)
    assert [int(nest.loop_of_value[v]) for v in program.arguments] == [-1, -1]
    assert not nest.loop_of_op.flags.writeable  # shared by every reader


def test_the_loop_structure_is_found_once_for_every_stage(monkeypatch):
    """Analysis (the dimension graph's loops), strategy (FSDP's split through the scan), kernel plan and
    loop-body pricing all read one structure: it is computed once per program (each stage found it anew)."""
    found = []
    compute = loops._loop_nest
    monkeypatch.setattr(loops, "_loop_nest", lambda program: found.append(program) or compute(program))
    monkeypatch.setattr(loops, "_RECENT", [])
    analysis = analyze("nested", fn=_nested, args=ARGS, engine="embedded", cache=False)
    model = ShardingModel(analysis, parse_mesh("batch=2"))
    state, _ = manual_strategy(model, "fsdp", Roles({"batch": [("x", 0)]}))
    costs = CostModel(model, load_hardware("h100"))
    costs.evaluate(state)
    assert found == [analysis.program]
    assert costs.plan.nest is loop_nest(analysis.program)
    assert np.array_equal(costs.op_in_loop, costs.plan.nest.loop_of_op >= 0)
