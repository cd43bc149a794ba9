"""Code generation: our IR -> ISA kernels for one NeuronCore.

    lower_module(module, target, *, matmul_precision="default") -> hw.Program
    LoweringError                     # compile-time: op kind, types, source location
    register_lowering, register_step  # the registry: op kind -> kernel rule / step rule
    LowerCtx, StepCtx                 # what a kernel rule / a step rule sees

Each op of the entry function becomes one kernel (DMA in, compute, DMA out) over DRAM
tensors `arg<i>` (parameters), `out<i>` (results, each its own buffer), `t<i>` (HBM
temporaries) and `const:<i>` (initial data: non-splat constants, returned as
`program.constants`, a name -> array dict the runtime loads once per executable). A
`fusion` op (hlo_passes' fusion pass) is one kernel for all its ops. Control flow and
collectives become steps between kernels (`hw.program.While` / `Case` / `Collective`).

Modules, in dependency order:
  errors      LoweringError
  target      Target: what codegen may assume about one core (from hw.spec's CoreSpec)
  layout      tiling arithmetic (`tiles`, `flat_tiles`, `box_tiles`) and DRAM views
  builder     KernelBuilder: SBUF/PSUM allocation, rings, DMA queues, semaphores
  registry    the rules table (kernel rules, step rules), LowerCtx
  tileops/    one elementwise op on tiles (TILE_OPS): core, simple, mathops
  regions     Region (inputs as views, steps, outputs) and its Evaluator per tile box
  elementwise the generic elementwise rule: a Region tiled flat or by rows
  movement    DRAM copies (reshape), splat constants, iota
  relayout    transpose, broadcast_in_dim (SBUF expand, TensorE transpose, DMA)
  slicing     slice, concatenate, pad
  matmul_plan a matmul's operands and plan (SBUF fit, DMA cost, dma_transpose, double_row)
  matmul      the TensorE loop nest;  dot: dot_general (precision, canonical form)
  conv/       convolution: geometry, plan, staging, kernel (tap loop), wgrad, rule
  reduce      reduce with add / max / min (and / or on bool), from a tensor or a region
  argreduce   the two-operand reduce of argmax / argmin
  window      reduce_window;  selectscatter: select_and_scatter
  translate   a fusion op's region -> Region + root (reduce / dot_general)
  epilogue    a fused region applied to matmul output tiles leaving PSUM
  fusion      the "fusion" rule: loop / reduction / matmul_epilogue / attention kernels
  listing     Program.text;  driver: lower_module and StepCtx (the walk)
  control     step rules: while, case, call;  collective: the collectives
  callback    step rules: host callbacks (jax.debug.print, pure_callback, ...), tokens
  planes      trn.deinterleave / trn.interleave: complex64 parameters and results
"""
from .errors import LoweringError as LoweringError
from .registry import LOWERINGS as LOWERINGS
from .registry import LowerCtx as LowerCtx
from .registry import RuleKind as RuleKind
from .registry import register_lowering as register_lowering
from .registry import register_step as register_step
from .driver import StepCtx as StepCtx
from .driver import lower_module as lower_module

# Rule modules register themselves in the registry on import.
from . import elementwise as _elementwise  # noqa: F401,E402
from . import movement as _movement  # noqa: F401,E402
from . import relayout as _relayout  # noqa: F401,E402
from . import slicing as _slicing  # noqa: F401,E402
from . import dot as _dot  # noqa: F401,E402
from . import reduce as _reduce  # noqa: F401,E402
from . import argreduce as _argreduce  # noqa: F401,E402
from . import bitcast as _bitcast  # noqa: F401,E402
from . import planes as _planes  # noqa: F401,E402
from . import dynslice as _dynslice  # noqa: F401,E402
from . import gather as _gather  # noqa: F401,E402
from . import scatter as _scatter  # noqa: F401,E402
from . import conv as _conv  # noqa: F401,E402
from . import window as _window  # noqa: F401,E402
from . import selectscatter as _selectscatter  # noqa: F401,E402
from . import sort as _sort  # noqa: F401,E402
from . import topk as _topk  # noqa: F401,E402
from . import mx_matmul as _mx_matmul  # noqa: F401,E402
from . import control as _control  # noqa: F401,E402
from . import misc as _misc  # noqa: F401,E402
from . import collective as _collective  # noqa: F401,E402
from . import callback as _callback  # noqa: F401,E402
