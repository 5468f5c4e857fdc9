"""One suite over every op kind the bundled examples contain.

Every kind must be ruled (or be one of the few documented as unruled) and have a kernel class
(no unpriced op), every ruled op that maps dims must contribute identities, and the invariants
must hold.
"""

from __future__ import annotations

import functools

import pytest
from conftest import analysis_of

from toast.examples import EXAMPLES

# Kinds the rule base deliberately leaves unruled (no identities, reported): LAPACK calls
# whose sharding needs replication of the matrix dims, and fft (its transformed dims must be
# whole; not modelled yet).
KNOWN_UNRULED = {
    "stablehlo.custom_call @lapack_spotrf_ffi",
    "stablehlo.custom_call @lapack_strsm_ffi",
    "stablehlo.fft",
}
# Kinds whose ops identify nothing by design: sources, terminators and random bits.
IDENTIFY_NOTHING = {"stablehlo.constant", "stablehlo.iota", "stablehlo.return", "func.return",
                    "stablehlo.rng_bit_generator"}

# The zoo at the paper's sizes analyzes in 20-70 s each: slow (their small sizes cover the same op kinds).
FULL_SIZE = {EXAMPLES[name] for name in ("t2b", "t7b", "itx", "itx_prefill", "gns", "unet")}
SPECS = sorted(set(EXAMPLES.values()) - {"toast.examples.gpt:gpt_train_step"} - FULL_SIZE)


@functools.cache
def _all_kinds():
    kinds = {}
    for spec in SPECS:
        analysis = analysis_of(spec)
        for op in analysis.program.ops:
            kinds.setdefault(op.kind, spec)
    return kinds


@pytest.mark.parametrize("spec", SPECS + [pytest.param(spec, marks=pytest.mark.slow) for spec in sorted(FULL_SIZE)])
def test_invariants_hold_only_known_kinds_are_unruled_and_every_op_is_priced(spec):
    analysis = analysis_of(spec)
    assert analysis.invalid == ()
    assert {u.kind for u in analysis.unruled_ops} <= KNOWN_UNRULED
    assert analysis.unpriced_ops == ()


def test_every_op_kind_that_maps_dims_contributes_identities():
    kinds = _all_kinds()
    assert len(kinds) >= 60  # the zoo covers the StableHLO op set real programs use
    silent = []
    for kind, spec in sorted(kinds.items()):
        analysis = analysis_of(spec)
        if kind in IDENTIFY_NOTHING or any(u.kind.startswith(kind) for u in analysis.unruled_ops):
            continue
        ops_with_identities = {i.op for i in analysis.identities}
        mapping_ops = [op for op in analysis.program.ops if op.kind == kind
                       and any(analysis.program.values[v].shape for v in op.results + op.operands)]
        if mapping_ops and not any(op.id in ops_with_identities for op in mapping_ops):
            silent.append(kind)
    assert silent == []
