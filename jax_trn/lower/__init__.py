"""Code generation: our IR -> ISA kernels for one NeuronCore (`lower_module`).

Rules live one file per op family (`elementwise`, `movement`, `dot`, `reduce`) and
register themselves in `LOWERINGS` on import.
"""
from .errors import LoweringError as LoweringError
from .registry import LOWERINGS as LOWERINGS
from .registry import LowerCtx as LowerCtx
from .registry import register_lowering as register_lowering
from .driver import lower_module as lower_module

from . import elementwise as _elementwise  # noqa: F401  (registers rules)
from . import movement as _movement  # noqa: F401
from . import dot as _dot  # noqa: F401
from . import reduce as _reduce  # noqa: F401
from . import relayout as _relayout  # noqa: F401
from . import slicing as _slicing  # noqa: F401
