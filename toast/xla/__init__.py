"""Stage 9, xla: XLA's SPMD partitioner on host CPU devices (``worker``, run in a subprocess) and
the comparison of predictions with what it compiled (``validate``)."""

from toast.xla.validate import Agreement, compare, format_agreement, validate
from toast.xla.worker import Numerics, XlaCollective, XlaReport, check_sharded_module

__all__ = ["Agreement", "Numerics", "XlaCollective", "XlaReport", "check_sharded_module", "compare",
           "format_agreement", "validate"]
