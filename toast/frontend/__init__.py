"""Stage 1, frontend: StableHLO (text, bytecode, or a JAX callable) in, ``Program`` out.

``ir`` holds the program representation, ``stablehlo`` the reader over the MLIR bindings,
``loading`` what a user names (a ``.mlir`` file, a ``module:function`` factory), ``torch_step`` a
PyTorch module's training step as a JAX function (through torchax; torch is imported only there), ``loops`` the
program's while loops (``loop_nest``: how they nest and their trip counts, found once per program).
"""

from toast.frontend.ir import Op, Program, Value
from toast.frontend.loading import load_program, resolve_factory
from toast.frontend.stablehlo import lower_callable, read_callable, read_file, read_text

__all__ = ["Op", "Program", "Value", "load_program", "lower_callable", "read_callable", "read_file", "read_text",
           "resolve_factory"]
