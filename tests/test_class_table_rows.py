"""``toast.cost.class_table.ClassTable.table`` row for row as ``CommunicationModel.table`` on states whose parts take
any of the mesh's masks (valid or not): all-to-alls, gathers of several dims, reduce-scatters, partial results over
mixed reduced masks and use sites XLA's CSE merges, which the search's random walks seldom reach."""

from __future__ import annotations

import numpy as np

import toast
from toast.cost import class_table
from toast.cost.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, CommunicationModel
from toast.search.actions import ActionSpace
from toast.sharding.state import ShardingModel, ShardingState

COLUMNS = ("kind", "axes_mask", "value", "op", "operand", "bytes_in", "bytes_out", "last_op")


def test_class_table_rows_are_the_full_tables_on_any_part_masks():
    model = ShardingModel(toast.analyze("toast.examples.gpt:gpt_small?layers=2", engine="embedded"),
                          toast.parse_mesh("batch=2,model=2"))
    space = ActionSpace(model)
    communication = CommunicationModel(model)
    table = class_table.ClassTable(communication, space.partition)
    rng = np.random.default_rng(0)
    seen = {kind: 0 for kind in (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER)}
    several_dims = 0
    for _ in range(25):
        # Each part unsharded (most often) or split over data/batch, model or both.
        parts = rng.choice(np.asarray([0, 0, 0, 1, 2, 3], dtype=np.uint8), len(space.partition.first_name))
        state = ShardingState.of_parts(model.mesh, parts, (), space.partition)
        found, full = table.table(state), communication.table(state)
        for column in COLUMNS:
            got, want = getattr(found, column), getattr(full, column)
            assert got.dtype == want.dtype and np.array_equal(got, want), column
        for kind in seen:
            seen[kind] += int(np.count_nonzero(full.kind == kind))
        # A use gathering several dims: consecutive all-gathers of one op's operand.
        gathers = full.kind == ALL_GATHER
        several_dims += int(np.count_nonzero(gathers[1:] & gathers[:-1] & (full.op[1:] == full.op[:-1])
                                             & (full.operand[1:] == full.operand[:-1])))
    assert all(seen.values()), seen
    assert several_dims
