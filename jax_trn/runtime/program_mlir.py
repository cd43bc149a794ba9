"""The compiled program as MLIR, for `compiled.as_text()` (PJRT_Executable_OptimizedProgram).

JAX converts what OptimizedProgram returns into an HloModule and prints it, so we
describe our optimized per-device program in StableHLO: one `stablehlo.custom_call
@trn.kernel` per kernel, from the HBM tensors it reads to those it writes, with the
kernel's name, source ops, instruction counts per engine and compiler notes (fusion
kind, the fusion pass's decisions, how the lowering applied them) in `backend_config`:

    "fusion.3: dot_general at f.py:5; add at f.py:5; tanh at f.py:5 | dma x12, ... |
     SBUF 30720 B/partition | fusion_kind: matmul_epilogue; decision: ...; ..."
"""
from __future__ import annotations

from collections import Counter

from jax_trn.hw.isa import DmaCopy, DramAP

_MLIR_TYPES = {
    "float32": "f32", "bfloat16": "bf16", "float16": "f16", "float8_e4m3fn": "f8E4M3FN",
    "float8_e5m2": "f8E5M2", "bool": "i1", "int8": "i8", "int16": "i16", "int32": "i32",
    "int64": "i64", "uint8": "ui8", "uint16": "ui16", "uint32": "ui32", "uint64": "ui64",
}


def tensor_type(t) -> str:
    dims = "".join(f"{d}x" for d in t.shape)
    return f"tensor<{dims}{_MLIR_TYPES[t.dtype]}>"


def _reads_writes(kernel) -> tuple[list[str], list[str]]:
    reads, writes = [], []
    for instr in kernel.instructions:
        if isinstance(instr, DmaCopy):
            if isinstance(instr.src, DramAP) and instr.src.tensor not in reads:
                reads.append(instr.src.tensor)
            if isinstance(instr.dst, DramAP) and instr.dst.tensor not in writes:
                writes.append(instr.dst.tensor)
    return reads, writes


def _config(kernel) -> str:
    counts = Counter(getattr(i, "engine", "?") for i in kernel.instructions)
    engines = ", ".join(f"{e} x{n}" for e, n in sorted(counts.items()))
    ops = "; ".join(kernel.ops)
    text = f"{kernel.name}: {ops} | {engines} | SBUF {kernel.sbuf_bytes} B/partition"
    notes = getattr(kernel, "notes", None)
    if notes:
        text += " | " + "; ".join(notes)
    return text.replace("\\", "/").replace('"', "'")


def program_mlir(name: str, program) -> str:
    """MLIR text of `program` (a jax_trn.hw.program.Program)."""
    tensors = {t.name: t for t in [*program.params, *program.outputs, *program.temps]}
    values = {p.name: f"%arg{i}" for i, p in enumerate(program.params)}
    body, counter = [], 0
    for kernel in program.kernels:
        reads, writes = _reads_writes(kernel)
        ins = [n for n in reads + [w for w in writes if w in values and w not in reads]
               if n in values]
        outs = [w for w in writes if w in tensors]
        if not outs:
            continue
        results = [f"%{counter + i}" for i in range(len(outs))]
        counter += len(outs)
        in_types = ", ".join(tensor_type(tensors[n]) for n in ins)
        out_types = ", ".join(tensor_type(tensors[n]) for n in outs)
        lhs = ", ".join(results) if len(results) == 1 else f"%{counter - len(outs)}:{len(outs)}"
        body.append(f'    {lhs} = stablehlo.custom_call @trn.kernel('
                    f'{", ".join(values[n] for n in ins)}) {{backend_config = "{_config(kernel)}"}}'
                    f' : ({in_types}) -> ({out_types}) loc("{kernel.name}")')
        for i, n in enumerate(outs):
            values[n] = results[0] if len(outs) == 1 else f"%{counter - len(outs)}#{i}"
    rets = []
    for t in program.outputs:
        if t.name not in values:            # never written: a size-0 result
            values[t.name] = f"%empty{len(rets)}"
            body.append(f"    {values[t.name]} = stablehlo.constant dense<> : {tensor_type(t)}")
        rets.append(values[t.name])
    args = ", ".join(f"%arg{i}: {tensor_type(p)}" for i, p in enumerate(program.params))
    out_types = ", ".join(tensor_type(t) for t in program.outputs)
    ret_types = ", ".join(tensor_type(t) for t in program.outputs)
    lines = [f"module @{_symbol(name)} {{",
             f"  func.func @main({args}) -> ({out_types}) {{", *body,
             f"    return {', '.join(rets)} : {ret_types}" if rets else "    return",
             "  }", "}"]
    return "\n".join(lines) + "\n"


def _symbol(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "module"
