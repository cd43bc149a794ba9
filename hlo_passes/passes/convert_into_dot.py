"""Folds a float convert that feeds only dot_generals into the dots' operand loads.

    %w16 = convert(%w)                  w: f32[1024, 8, 128] (a flax Dense kernel with
    %y = dot_general(%x, %w16)             dtype=bf16: the f32 parameter cast per call)
 -> %y = dot_general(%x, %w) {operand_types = ("bfloat16", "bfloat16")}

The matmul loads its operands into SBUF anyway, and a DMA casts through FP32 with
round-to-nearest-even (§3.4, §4), exactly as the convert does: the product sees the
same bf16 values, and the convert's kernel (read 4 bytes and write 2 per element, then
read 2 again) is gone. `operand_types` pins the types the operands are rounded to, so
a HIGHEST precision config still multiplies the program's bf16 values. Only f32 ->
bf16 / f16 converts fold, and only when:
- every user is a dot_general (another user keeps the converted array, and then the
  convert stays for all of them);
- the f32 array is an argument of the block (a parameter): a computed one is better
  converted inside the fusion that computes it, which then writes 2 bytes, not 4;
- no dot reads it with its contiguous axis contracted: such an operand is transposed
  on the way in, by dma_transpose only when no cast is needed (§3.4), so the bf16
  copy is cheaper there.
Runs after the attention passes, whose matchers look through converts.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.graph import BlockGraph, rewrite_blocks

name = "convert-into-dot"

SOURCES = frozenset({"float32"})
TARGETS = frozenset({"bfloat16", "float16"})


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    graph = BlockGraph(block)
    users, producer = graph.users, graph.producer
    args = set(block.args)
    changed = False
    for i, op in enumerate(block.ops):
        if op.kind != "dot_general" or "operand_types" in op.attrs:
            continue
        folded = [_source(v, producer, users, args) for v in op.operands]
        if all(f is None for f in folded):
            continue
        attrs = dict(op.attrs, operand_types=tuple(v.dtype for v in op.operands))
        operands = [f if f is not None else v for f, v in zip(folded, op.operands)]
        block.ops[i] = op.replace(operands=operands, attrs=attrs)
        changed = True
    return changed


def _source(v: ir.Value, producer: dict, users: dict, args: set) -> ir.Value | None:
    """The f32 argument behind a narrowing convert whose users are all dot_generals
    reading it untransposed."""
    conv = producer.get(v)
    if conv is None or conv.kind != "convert":
        return None
    src = conv.operands[0]
    if src.dtype not in SOURCES or v.dtype not in TARGETS or src not in args:
        return None
    if not all(u.kind == "dot_general" and not _transposed(u, v) for u in users[v]):
        return None
    return src


def _transposed(dot: ir.Op, v: ir.Value) -> bool:
    """Whether `dot` contracts `v`'s contiguous (last non-unit) axis while `v` has free
    positions: the matmul then loads it transposed (jax_trn.lower.matmul)."""
    shape = v.shape
    if v is dot.operands[0]:
        batch, contract = (dot.attrs.get(k, ()) for k in ("lhs_batching_dimensions",
                                                          "lhs_contracting_dimensions"))
    else:
        batch, contract = (dot.attrs.get(k, ()) for k in ("rhs_batching_dimensions",
                                                          "rhs_contracting_dimensions"))
    big = [d for d, n in enumerate(shape) if n != 1]
    free = [d for d in big if d not in batch and d not in contract]
    return bool(big) and big[-1] in contract and bool(free)
