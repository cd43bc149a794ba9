"""The NeuronCore instruction set, modelled on `nki.isa` (trainium-hardware.md §6.2).

Every instruction is a frozen dataclass with NKI-style keyword operands (`dst=`, `src=`,
`data=`, ...). Operands are `Tile`s (a region of SBUF or PSUM: a partition range and a
row-major free-axis block at a byte offset within each partition) or `DramAP`s (an
access pattern over a DRAM tensor in HBM). Operand constraints are checked when an
instruction is built (`__post_init__`), so a compiler bug is caught at the instruction;
constraints that depend on the generation are checked by `instr.check(spec)` when a
`NeuronCore` runs the kernel. `instr.execute(core)` applies it (semantics.py) and
`instr.cycles(spec)` prices it (costs.py): each instruction class names its semantics
and cost functions in its body (isa_base.py).

This module is the ISA's public face: it re-exports the operands (operands.py), the
base class (isa_base.py) and the instructions, one module per family: isa_dma.py,
isa_tensor.py, isa_vector.py, isa_gpsimd.py (`isa.NcMatmul`, ...). It defines nothing.
Import order, bottom up: spec, dtypes -> operands -> alu, numerics, mx, memory ->
semantics, costs -> isa_base -> isa_* -> isa.

| instruction          | engine               | meaning                                            |
|----------------------|----------------------|----------------------------------------------------|
| DmaCopy              | DMA queue            | dst = cast(src) through FP32; HBM/SBUF <-> HBM/SBUF|
| DmaGather            | DMA queue (swdge)    | dst[p, j] = table[indices[p, j]] (indirect rows)   |
| DmaScatter           | DMA queue (swdge)    | table[indices[p, j]] (+)= src[p, j] (indirect)     |
| DmaTranspose         | DMA queue (v3+)      | dst[B, A] = src[A, B], bit-exact, 2/4-byte types   |
| NcMatmul             | tensor               | dst[M,N] (+)= stationary[K,M].T @ moving[K,N]      |
| NcMatmulMx           | tensor (v4)          | as NcMatmul on MX data x E8M0 scales, K = 4 x P    |
| NcTranspose          | tensor / vector      | dst[F,P] = data[P,F]                               |
| Activation           | scalar               | dst = func(data * scale + bias); optional add-reduce|
| TensorTensor         | vector / gpsimd      | dst = data1 <op> data2                             |
| TensorScalar         | vector/scalar/gpsimd | dst = (data <op0> operand0) <op1> operand1         |
| ScalarTensorTensor   | vector               | dst = (data <op0> operand0) <op1> operand1 (tile)  |
| TensorReduce         | vector               | dst = reduce<op>(data) over free axes `axis`       |
| BnStats              | vector               | dst[P, 6] = (count, mean, var*count) of even/odd   |
| BnAggr               | vector               | dst[P, 2] = (mean, var) of bn_stats triples        |
| TensorPartitionReduce| gpsimd               | dst[1, F] = reduce<op>(data[P, F]) over partitions |
| TensorCopy           | vector/scalar/gpsimd | dst = cast(src)                                    |
| Memset               | vector / gpsimd      | dst = value                                        |
| Iota                 | gpsimd               | dst[p, f] = offset + p*channel_multiplier + pattern(f) |
| Select               | vector / gpsimd      | dst = on_true where pred != 0 else on_false        |
| AffineSelect         | gpsimd               | dst = on_true_tile where cmp(affine(p, f), 0) else on_false_value |
| Exponential          | vector (v4)          | dst = exp(src - max_value); reduce_res = sum(dst)  |
| QuantizeMx           | vector (v4)          | dst, dst_scale = MXFP8 x4 data + E8M0 scales of src|
| TensorTensorScan     | vector               | dst[:, i] = (data0[:, i] <op0> dst[:, i-1]) <op1> data1[:, i] |
| Max8                 | vector               | dst = the 8 largest values per partition           |
| FindIndex8           | vector               | dst = positions of 8 given values per partition    |
| MatchReplace8        | vector               | dst = data with 8 given values replaced            |

Engines compute in FP32 with casts on input and output (§2.3, §2.4, §4); integer
operands run natively on GpSimd (§2.5).

Checked at construction (IsaError):
- compute operands are Tiles; GpSimd never touches PSUM (§2.5); a tile of 65-128
  partitions starts at partition 0, of 33-64 at 0 or 64, of <=32 at a multiple of 32
  (§3.1); elementwise operands have equal partition counts and element counts, and
  may change partitions only within <=64-partition groups (§2.3); packed MX types
  (dtypes.py) only where an instruction takes them, or bit-exact copies;
- DmaCopy: Tile or DramAP on both sides, never PSUM, equal element counts (shapes
  may differ: the data is reshaped row-major); MX types are never cast (§3.4);
- NcMatmul: stationary/moving in SBUF with equal partitions (K), stationary free
  <= 128, dst [M, N] in PSUM, float inputs, FP32 only with FP32 (§2.2),
  `precision="tf32"` for FP32 operands rounded to TF32, `perf_mode="double_row"` for
  FP8 [K, 2, M] x [K, 2, N] (K = 2 x partitions);
- NcMatmulMx: x4 MX operands, partitions a multiple of 32, stationary free even
  <= 128, E8M0 scales in the layout of mx.py (§2.2);
- NcTranspose: tensor <= 128x128 SBUF -> PSUM, vector <= 32x32 (§6.2);
- TensorTensor, ScalarTensorTensor: not both tensor inputs in PSUM (§6.2);
  TensorReduce: free axes only; QuantizeMx: partitions a multiple of 32, free a
  multiple of 4 (§6.2).
Checked per generation by `check(spec)`: moving free size and PSUM banks, BF16 PSUM
and `float8_e4m3fn` (v4), double_row (v3+), MX / Exponential / QuantizeMx (v4),
DmaTranspose (v3+), DMA queue count; at run time (semantics.py), accumulating onto
PSUM data not written by a matmul (undefined on v2/v3, §2.2).
"""
from __future__ import annotations

from .isa_base import ENGINES, Instr
from .isa_dma import DmaCopy, DmaGather, DmaScatter, DmaTranspose
from .isa_gpsimd import AffineSelect, Iota, TensorPartitionReduce
from .isa_tensor import NcMatmul, NcMatmulMx, NcTranspose
from .isa_vector import (Activation, BnAggr, BnStats, Exponential, FindIndex8, MatchReplace8, Max8, Memset,
                         QuantizeMx, ScalarTensorTensor, Select, TensorCopy, TensorReduce,
                         TensorScalar, TensorTensor, TensorTensorScan)
from .operands import DramAP, IsaError, Operand, Scalar, Tile
from .spec import PMAX

__all__ = ["IsaError", "Tile", "DramAP", "Operand", "Scalar", "Instr", "PMAX", "ENGINES",
           "DmaCopy", "DmaGather", "DmaScatter", "DmaTranspose", "NcMatmul", "NcMatmulMx",
           "NcTranspose", "Activation", "TensorTensor", "TensorScalar",
           "ScalarTensorTensor", "TensorReduce", "TensorPartitionReduce", "TensorCopy",
           "Memset", "Iota", "Select", "AffineSelect", "Exponential", "QuantizeMx",
           "TensorTensorScan", "Max8", "FindIndex8", "MatchReplace8", "BnStats", "BnAggr"]
