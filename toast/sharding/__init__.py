"""Stage 5, sharding: logical meshes (``mesh``), sharding states and actions (``state``), and the
manual strategies built from argument roles (``strategies``)."""

from toast.sharding.mesh import Mesh, parse_mesh
from toast.sharding.state import Action, InvalidState, ShardingModel, ShardingState, spec_entries
from toast.sharding.strategies import STRATEGIES, ShardNodes, manual_strategy

__all__ = ["STRATEGIES", "Action", "InvalidState", "Mesh", "ShardNodes", "ShardingModel", "ShardingState",
           "manual_strategy", "parse_mesh", "spec_entries"]
