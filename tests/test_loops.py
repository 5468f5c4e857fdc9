"""Loops read like the unrolled layers they run (box crossing in ``toast.analysis.dimension_graph``).

A ``stablehlo.while`` identifies its carried values across iterations, so its dimension graph
has cycles (body -> returned value -> block argument -> body). A box inside one iteration is
crossed only by a path inside that iteration; a box outside the loop by a path through any
number of iterations.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import pytest
from conftest import engines

from toast import analyze
from toast.examples.gpt import gpt_small

SQUARE = jax.ShapeDtypeStruct((16, 16), jnp.float32)


@functools.cache
def _gpt(layers: int, scan: bool, engine: str):
    fn, args = gpt_small(layers=layers, scan_layers=scan)
    return analyze(f"gpt L={layers} scan={scan}", fn=fn, args=args, engine=engine)


@pytest.mark.parametrize("engine", engines())
@pytest.mark.parametrize("layers", [2, 12])
def test_gpt_scan_has_the_bits_of_the_unrolled_step(layers, engine):
    """One bit, as unrolled: before loops were read by iteration, the back edges put the loop
    bodies in one strongly connected component, 35 of 93 boxes were crossed and gpt_scan had
    34 compatibility sets and 19 bits at any L."""
    unrolled = _gpt(2, False, engine)
    assert unrolled.conflicts.resolution_bits == 1
    scan = _gpt(layers, True, engine)
    stats = scan.stats
    assert scan.invalid == ()
    assert stats["conflicts"] > 0 and stats["boxes"] > 0
    assert stats["crossed_boxes"] == 0 and stats["contradicting_boxes"] == 0
    # The forward loop, the backward loop and the code around them: one set, as one unrolled
    # layer's forward and backward conflicts are one set.
    assert stats["compatibility_sets"] == 1
    assert stats["resolution_bits"] == unrolled.conflicts.resolution_bits == 1


def _orientation(analysis) -> dict[str, set[tuple[int, int]]]:
    """Op kind -> the (sharded, unsharded) dims, counted from the last, that resolution 0
    gives the conflicts on the definitions that op kind makes."""
    program, found = analysis.program, analysis.conflicts
    kinds: dict[str, set[tuple[int, int]]] = collections.defaultdict(set)
    for group_set in found.sets:
        for conflict_id, endpoint in zip(group_set.conflicts, group_set.sharded_endpoints(0), strict=True):
            for site in found.conflicts[conflict_id].sites:
                if site.kind == "def" and program.producer[site.value] >= 0:
                    rank = len(program.values[site.value].shape)
                    kind = program.ops[program.producer[site.value]].kind
                    kinds[kind].add((site.dims[endpoint] - rank, site.dims[1 - endpoint] - rank))
    return kinds


def test_gpt_scan_resolutions_shard_what_the_unrolled_ones_shard():
    """Bit r picks the same dims of the attention scores, probabilities and their gradients
    (stacked or not) in the loop as in the unrolled layers: one orientation per op kind."""
    scan, unrolled = _orientation(_gpt(2, True, "embedded")), _orientation(_gpt(2, False, "embedded"))
    common = set(scan) & set(unrolled)
    assert {"stablehlo.dot_general", "stablehlo.divide", "stablehlo.select"} <= common
    for kind in common:
        assert scan[kind] == unrolled[kind], kind
        assert len(scan[kind]) == 1, kind


def _scan(body, length: int = 3):
    def f(x):
        return jax.lax.scan(body, x, None, length=length)[0]
    return f


def _box_body(c, _):
    a = c @ c.T
    return a * a, None


def _crossing_body(c, _):
    a = c @ c.T
    return a * a.T, None


def _crossed_defs(analysis) -> list[str]:
    """The kinds of op defining the value of each crossed box's definition conflict."""
    program, found = analysis.program, analysis.conflicts
    kinds = []
    for box in found.boxes:
        if box.crossed:
            site = next(s for s in found.conflicts[box.def_conflict].sites if s.kind == "def")
            kinds.append(program.ops[program.producer[site.value]].kind)
    return kinds


@pytest.mark.parametrize("engine", engines())
def test_a_loop_body_is_checked_as_one_iteration(engine):
    """``a * a`` in a loop body is a plain box (crossed before: the back edge joined a's dims);
    ``a * a.T`` is crossed inside one iteration, in the loop as in straight-line code."""
    box = analyze("scan box", fn=_scan(_box_body), args=(SQUARE,), engine=engine)
    assert box.stats["boxes"] > 0 and box.stats["crossed_boxes"] == 0
    assert box.conflicts.resolution_bits == 1
    crossing = analyze("scan crossing", fn=_scan(_crossing_body), args=(SQUARE,), engine=engine)
    assert _crossed_defs(crossing) == ["stablehlo.dot_general"]


def test_nested_loops_are_checked_per_iteration():
    def nested(inner):
        def outer(c, _):
            return jax.lax.scan(inner, c, None, length=2)[0], None
        return _scan(outer)

    box = analyze("nested box", fn=nested(_box_body), args=(SQUARE,), engine="embedded")
    assert box.stats["boxes"] > 0 and box.stats["crossed_boxes"] == 0
    crossing = analyze("nested crossing", fn=nested(_crossing_body), args=(SQUARE,), engine="embedded")
    assert _crossed_defs(crossing) == ["stablehlo.dot_general"]


def _swap(carry, _):
    p, q = carry
    return (q, p.T), None


def _through_iterations(x):
    """v's dim 0 reaches p's dim 1 only through two iterations: p -> q.T, then q -> p."""
    v = x @ x.T
    (p, _), _ = jax.lax.scan(_swap, (v, v), None, length=3)
    return v + p


def test_a_box_around_a_loop_sees_paths_through_several_iterations():
    """The back edges still count for boxes outside the loop: the box of v and its use by the
    add is crossed by a path v:0 -> p:0 -> q:1 (iteration 1) -> p:1 (iteration 2) -> add:1."""
    analysis = analyze("through iterations", fn=_through_iterations, args=(SQUARE,), engine="embedded")
    assert _crossed_defs(analysis) == ["stablehlo.dot_general"]
    found = analysis.conflicts
    crossed = next(b for b in found.boxes if b.crossed)
    use_kinds = {analysis.program.ops[s.op].kind for s in found.conflicts[crossed.use_conflict].sites
                 if s.kind == "use"}
    assert use_kinds == {"stablehlo.add"}

    def inside(x):  # the same loop inside an outer loop's body: the inner back edges count there
        return _scan(lambda c, _: (_through_iterations(c), None), length=2)(x)

    nested = analyze("through iterations, nested", fn=inside, args=(SQUARE,), engine="embedded")
    assert _crossed_defs(nested) == ["stablehlo.dot_general"]
