"""Hand-written kernels in Python, NKI style: tiles in SBUF and PSUM, one call per
instruction of the NeuronCore ISA, called from JAX next to compiler-generated code and
simulated with cycles on Trn1 / Trn2 / Trn3.

    from jax_trn import kernels
    import jax_trn.kernels.language as nl
    import jax_trn.kernels.isa as nisa

    @kernels.jit
    def scale(x, factor):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(x.shape[0] // 128):
            t = nl.load(x[i * 128:(i + 1) * 128, :])
            nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=nl.multiply(t, factor))
        return out

    y = jax.jit(lambda x: scale(x, 2.0))(x_on_trn)          # one kernel in the program
    run = kernels.simulate(scale, np.ones((256, 512), np.float32), 2.0, system="trn2")
    print(run.execution.summary())                           # cycles, engines, MFU

Modules: `language` (nl: types, buffers, tensors, loops, operators, index expressions),
`isa` (nisa: the instructions), `tensors` (views, indexing, masks), `trace` (tracing,
buffer lifetimes, PSUM accumulation state, errors with the kernel's line), `kernel`
(the decorator, the standalone run), `call` (the JAX primitive), `rule` (the
compiler's lowering rule for it), `compiler` (placement, directives) and `typing`
(annotations), as NKI names them: `import jax_trn.kernels as nki` ports a kernel.
"""
from __future__ import annotations

from . import isa, language, typing  # noqa: F401
from . import call, rule  # noqa: F401  (the JAX primitive; the lowering rule)
from .errors import KernelError
from . import compiler  # noqa: F401  (NKI's nki.compiler names)
from .kernel import KernelFunction, KernelRun, baremetal, benchmark, jit, simulate, simulate_kernel

__all__ = ["jit", "baremetal", "benchmark", "simulate", "simulate_kernel", "KernelError",
           "KernelFunction", "KernelRun", "language", "isa", "typing", "compiler"]
