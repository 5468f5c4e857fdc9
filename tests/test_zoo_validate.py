"""Every small zoo model under every manual strategy that applies (and toast's own) runs sharded on 8 host
CPU devices with the unsharded program's outputs: XLA compiles the strategy's module with its SPMD
partitioner and runs both on the same seeded inputs (``toast compare --validate``). Slow: XLA compiles a
training step per strategy."""

from __future__ import annotations

import pytest

import toast
from toast.search import Budget
from toast.sharding.roles import roles_for_input

ZOO_SMALL = ["toast.examples.gemma:gemma_small", "toast.examples.itx:itx_small",
             "toast.examples.itx:itx_prefill_small", "toast.examples.gns:gns_small", "toast.examples.unet:unet_small"]


@pytest.mark.slow
@pytest.mark.parametrize("spec", ZOO_SMALL)
def test_small_zoo_models_validate_under_every_strategy(spec):
    analysis = toast.analyze(spec, engine="embedded")
    result = toast.compare(analysis, toast.parse_mesh("batch=2,model=4"), toast.load_hardware("a100_80gb"),
                           source=spec, roles=roles_for_input(spec), budget=Budget(rollouts=64, workers=1),
                           validate_on_host=True)
    applied = [row for row in result.rows if row.cost is not None]
    assert len(applied) >= 4, [(row.name, row.reason) for row in result.rows]  # toast, data_parallel, megatron, fsdp
    for row in applied:
        assert row.agreement is not None and row.agreement.numerics.match, (spec, row.name)
