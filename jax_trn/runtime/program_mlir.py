"""The compiled program as MLIR, for `compiled.as_text()` (PJRT_Executable_OptimizedProgram).

JAX converts what OptimizedProgram returns into an HloModule and prints it, so we
describe our optimized per-device program in StableHLO: one `stablehlo.custom_call
@trn.kernel` per kernel, from the HBM tensors it reads to those it writes, with the
kernel's name, source ops, instruction counts per engine and compiler notes (fusion
kind, the fusion pass's decisions, how the lowering applied them) in `backend_config`.
Loops and conditionals between kernels are `stablehlo.while` / `stablehlo.case` whose
regions hold the kernels of the cond / body / branches:

    "fusion.3: dot_general at f.py:5; add at f.py:5; tanh at f.py:5 | dma x12, ... |
     SBUF 30720 B/partition | fusion_kind: matmul_epilogue; decision: ...; ..."
"""
from __future__ import annotations

from collections import Counter

from jax_trn.hw.isa import DmaCopy, DramAP
from jax_trn.hw.program import Case, Collective, HostCallback, Kernel, Loop, While

_MLIR_TYPES = {
    "float32": "f32", "bfloat16": "bf16", "float16": "f16", "float8_e4m3fn": "f8E4M3FN",
    "float8_e4m3": "f8E4M3",
    "float8_e5m2": "f8E5M2", "bool": "i1", "int8": "i8", "int16": "i16", "int32": "i32",
    "int64": "i64", "uint8": "ui8", "uint16": "ui16", "uint32": "ui32", "uint64": "ui64",
    "complex64": "complex<f32>", "int4": "i4", "uint4": "ui4",
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


def program_mlir(name: str, program, boundary=None) -> str:
    """MLIR text of `program` (a jax_trn.hw.program.Program). `boundary`: the types
    JAX sees for the parameters and outputs when they differ from the program's
    (complex64 for float32[..., 2], `trn.complex_boundary` of the module)."""
    tensors = {t.name: t for t in [*program.params, *program.outputs, *program.temps]}
    shown = {}
    if boundary is not None:
        for t, b in zip([*program.params, *program.outputs], [*boundary[0], *boundary[1]]):
            if (tuple(t.shape), t.dtype) != (tuple(b.shape), b.dtype):
                shown[t.name] = b
    em = _Emitter(tensors, shown)
    ttype = em.ttype
    env = {p.name: f"%arg{i}" for i, p in enumerate(program.params)}
    body = em.steps(program.steps, env, "    ")
    rets = []
    for t in program.outputs:
        if t.name not in env:               # never written: a size-0 result
            env[t.name] = em.fresh()
            body.append(f"    {env[t.name]} = stablehlo.constant dense<> : {ttype(t)}")
        rets.append(env[t.name])
    args = ", ".join(f"%arg{i}: {ttype(p)}" for i, p in enumerate(program.params))
    out_types = ", ".join(ttype(t) for t in program.outputs)
    lines = [f"module @{_symbol(name)} {{",
             f"  func.func @main({args}) -> ({out_types}) {{", *body,
             f"    return {', '.join(rets)} : {out_types}" if rets else "    return",
             "  }", "}"]
    return "\n".join(lines) + "\n"


class _Emitter:
    """Steps -> MLIR lines. `env` maps a DRAM tensor's name to the SSA value holding its
    current contents; a loop or conditional is a stablehlo.while / stablehlo.case whose
    regions see a copy of `env` (implicit captures), with the loop-carried tensors as
    block arguments and results."""

    def __init__(self, tensors: dict, shown: dict | None = None):
        self.tensors = tensors
        self.shown = shown or {}
        self.counter = 0

    def ttype(self, t) -> str:
        """The MLIR type of DRAM tensor `t`, as JAX sees it if it is a parameter or
        an output shown with another type."""
        return tensor_type(self.shown.get(getattr(t, "name", None), t))

    def fresh(self) -> str:
        self.counter += 1
        return f"%v{self.counter}"

    def steps(self, steps, env: dict[str, str], indent: str) -> list[str]:
        lines = []
        for step in steps:
            if isinstance(step, Kernel):
                lines += self.kernel(step, env, indent)
            elif isinstance(step, While):
                lines += self.loop(step, env, indent)
            elif isinstance(step, Case):
                lines += self.case(step, env, indent)
            elif isinstance(step, Loop):
                lines += self.on_chip(step, env, indent)
            elif isinstance(step, Collective):
                lines += self.collective(step, env, indent)
            elif isinstance(step, HostCallback):
                lines += self.host_callback(step, env, indent)
        return lines

    def host_callback(self, step: HostCallback, env, indent: str) -> list[str]:
        """A host callback as `custom_call @trn.host_callback` (side effecting)."""
        from jax_trn.lower.listing import format_host_callback
        lines: list[str] = []
        ins = [self.value(t, env, indent, lines) for t in step.operands]
        outs = step.results
        for t in outs:
            self.tensors.setdefault(t.name, t)
        lines.append(self.custom_call(
            indent, self.fresh(), "trn.host_callback", ins, step.operands, outs, env,
            format_host_callback(step).replace('"', "'"), step.name, side_effect=True))
        return lines

    def collective(self, step: Collective, env, indent: str) -> list[str]:
        """A collective as `custom_call @trn.collective`, described in its config."""
        from jax_trn.lower.listing import format_collective
        lines: list[str] = []
        ins = [self.value(t, env, indent, lines) for t in step.operands]
        for t in step.results:
            self.tensors.setdefault(t.name, t)
        lines.append(self.custom_call(
            indent, self.fresh(), "trn.collective", ins, step.operands, step.results, env,
            format_collective(step).replace('"', "'"), step.name))
        return lines

    def kernel(self, kernel, env, indent: str) -> list[str]:
        reads, writes = _reads_writes(kernel)
        for t in kernel.dram.values():
            self.tensors.setdefault(t.name, t)
        ins = [n for n in reads + [w for w in writes if w in env and w not in reads]
               if n in env]
        outs = [w for w in writes if w in self.tensors]
        if not outs and (kernel.instructions or not kernel.ops):
            return []
        # no results: a sink (e.g. dce_sink), listed as XLA lists it
        return [self.custom_call(
            indent, self.fresh() if outs else "", "trn.kernel", [env[n] for n in ins],
            [self.tensors[n] for n in ins], [self.tensors[n] for n in outs], env,
            _config(kernel), kernel.name, side_effect=not outs)]

    def custom_call(self, indent: str, result: str, target: str, args: list[str], operands,
                    results, env, config: str, loc: str, side_effect: bool = False) -> str:
        """One `stablehlo.custom_call @target` line; binds `results` (DRAM tensors) to
        `result` (or its parts) in `env`."""
        n = len(results)
        lhs = "" if not n else f"{result} = " if n == 1 else f"{result}:{n} = "
        for i, t in enumerate(results):
            env[t.name] = result if n == 1 else f"{result}#{i}"
        effect = ", has_side_effect = true" if side_effect else ""
        in_types = ", ".join(self.ttype(t) for t in operands)
        out_types = ", ".join(self.ttype(t) for t in results)
        return (f'{indent}{lhs}stablehlo.custom_call @{target}({", ".join(args)}) '
                f'{{backend_config = "{config}"{effect}}} : ({in_types}) -> ({out_types})'
                f' loc("{loc}")')

    def value(self, t, env, indent: str, lines: list[str]) -> str:
        """The SSA value of tensor `t` (a zero constant if nothing wrote it yet)."""
        if t.name not in env:
            self.tensors.setdefault(t.name, t)
            env[t.name] = self.fresh()
            zero = "false" if t.dtype == "bool" else "0"
            dense = f"dense<{zero}>" if t.size else "dense<>"
            lines.append(f"{indent}{env[t.name]} = stablehlo.constant {dense} : {self.ttype(t)}")
        return env[t.name]

    def loop(self, step: While, env, indent: str) -> list[str]:
        lines: list[str] = []
        types = [self.ttype(t) for t in step.carried]
        inits = [self.value(t, env, indent, lines) for t in step.carried]
        regions = []
        for part, what in ((step.cond, "cond"), (step.body, "body")):
            inner = dict(env)
            args = [self.fresh() for _ in step.carried]
            inner.update((t.name, a) for t, a in zip(step.carried, args))
            region = [f"{indent}^bb0({', '.join(f'{a}: {ty}' for a, ty in zip(args, types))}):"]
            region += self.steps(part, inner, indent + "  ")
            if what == "cond":
                pred = self.value(step.pred, inner, indent + "  ", region)
                region.append(f'{indent}  "stablehlo.return"({pred}) : (tensor<i1>) -> ()')
            else:
                outs = [self.value(t, inner, indent + "  ", region) for t in step.carried]
                region.append(f'{indent}  "stablehlo.return"({", ".join(outs)}) : '
                              f'({", ".join(types)}) -> ()')
            regions.append(region)
        lines += self._op('"stablehlo.while"', inits, types, types, regions, step, env,
                          step.carried, indent)
        return lines

    def on_chip(self, step: Loop, env, indent: str) -> list[str]:
        """An on-chip loop: its enter kernels, a `stablehlo.while` counting its trips
        (counter < limit, counter + step: the sequencers' registers) around its body
        kernels, its exit kernels."""
        lines = self.steps(step.enter, env, indent)
        types = [self.ttype(t) for t in step.carried]
        inits = [self.value(t, env, indent, lines) for t in step.carried]
        counter = step.carried[step.counter_carry]
        limit = step.start + step.trips * step.step
        regions = []
        for what in ("cond", "body"):
            inner, i2 = dict(env), indent + "  "
            args = [self.fresh() for _ in step.carried]
            inner.update((t.name, a) for t, a in zip(step.carried, args))
            region = [f"{indent}^bb0({', '.join(f'{a}: {ty}' for a, ty in zip(args, types))}):"]
            const, res = self.fresh(), self.fresh()
            region.append(f"{i2}{const} = stablehlo.constant dense<"
                          f"{limit if what == 'cond' else step.step}> : tensor<i32>")
            if what == "cond":
                region.append(f"{i2}{res} = stablehlo.compare  LT, {inner[counter.name]}, "
                              f"{const},  SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>")
                region.append(f'{i2}"stablehlo.return"({res}) : (tensor<i1>) -> ()')
            else:
                region += self.steps(step.body, inner, i2)
                region.append(f"{i2}{res} = stablehlo.add {inner[counter.name]}, {const} "
                              f": tensor<i32>")
                inner[counter.name] = res
                outs = [self.value(t, inner, i2, region) for t in step.carried]
                region.append(f'{i2}"stablehlo.return"({", ".join(outs)}) : '
                              f'({", ".join(types)}) -> ()')
            regions.append(region)
        lines += self._op('"stablehlo.while"', inits, types, types, regions, step, env,
                          step.carried, indent)
        return lines + self.steps(step.exit, env, indent)

    def case(self, step: Case, env, indent: str) -> list[str]:
        lines: list[str] = []
        types = [self.ttype(t) for t in step.results]
        index = self.value(step.index, env, indent, lines)
        regions = []
        for branch in step.branches:
            inner = dict(env)
            region = self.steps(branch, inner, indent + "  ")
            outs = [self.value(t, inner, indent + "  ", region) for t in step.results]
            region.append(f'{indent}  "stablehlo.return"({", ".join(outs)}) : '
                          f'({", ".join(types)}) -> ()')
            regions.append(region)
        lines += self._op('"stablehlo.case"', [index], [self.ttype(step.index)], types,
                          regions, step, env, step.results, indent)
        return lines

    def _op(self, kind, operands, in_types, out_types, regions, step, env, results,
            indent: str) -> list[str]:
        result = self.fresh() if results else ""
        lhs = (f"{result} = " if len(results) == 1 else
               f"{result}:{len(results)} = " if results else "")
        lines = [f"{indent}{lhs}{kind}({', '.join(operands)}) ({{"]
        for i, region in enumerate(regions):
            lines += region
            lines.append(f"{indent}}}" + (", {" if i + 1 < len(regions) else ""))
        lines[-1] += (f") : ({', '.join(in_types)}) -> ({', '.join(out_types)})"
                      f' loc("{step.name}")')
        for i, t in enumerate(results):
            env[t.name] = result if len(results) == 1 else f"{result}#{i}"
        return lines


def _symbol(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "module"
