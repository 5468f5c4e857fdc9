"""Stage 6, cost: accelerator profiles (``hardware``), the collectives a state needs
(``collectives``) and the analytical cost model (``model``)."""

from toast.cost.collectives import Collective, CommunicationModel
from toast.cost.hardware import Hardware, InterconnectLevel, known_hardware, load_hardware
from toast.cost.model import Cost, CostModel

__all__ = ["Collective", "CommunicationModel", "Cost", "CostModel", "Hardware", "InterconnectLevel",
           "known_hardware", "load_hardware"]
