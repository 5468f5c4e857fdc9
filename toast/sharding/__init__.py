"""Stage 5, sharding: logical meshes (``mesh``), sharding states and actions (``state``), the
roles of argument dims (``roles``), and the expert strategies built from them (``strategies``)."""

from toast.sharding.mesh import Mesh, parse_mesh
from toast.sharding.roles import ROLE_NAMES, Roles, load_roles, roles_for_input
from toast.sharding.state import Action, InvalidState, ShardingModel, ShardingState, spec_entries
from toast.sharding.strategies import (
    COMPOSITES,
    EXPERT_STRATEGIES,
    NEEDS,
    STRATEGIES,
    STRATEGY_NAMES,
    ExpertStrategy,
    ShardNodes,
    check_strategy,
    manual_strategy,
)

__all__ = ["COMPOSITES", "EXPERT_STRATEGIES", "NEEDS", "ROLE_NAMES", "STRATEGIES", "STRATEGY_NAMES", "Action",
           "ExpertStrategy", "InvalidState", "Mesh", "Roles", "ShardNodes", "ShardingModel", "ShardingState",
           "check_strategy", "load_roles", "manual_strategy", "parse_mesh", "roles_for_input", "spec_entries"]
