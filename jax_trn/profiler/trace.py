"""Per-instruction trace records: what ran where and when, and why it waited.

The hardware model reports one `hw.trace.TraceEvent` per instruction (queue, interval,
bytes, FLOPs). The profiler joins each event with the instruction that produced it and
the kernel it belongs to, giving an `Instruction`: its kernel (fused region), the JAX
ops and source lines of that kernel, its semaphore waits and which of them held it
back, and for DMAs the bytes per descriptor.

The join needs no extra hardware field: each queue runs its instructions in program
order, so the n-th event of queue q in a kernel run is the n-th instruction of the
kernel whose `.queue` is q. A semaphore wait `(q, count)` is met when the count-th
instruction of queue q ends; the wait that was met last is the one the instruction
waited on (`waited_on`), and the gap `start_ns - wait_start_ns` is its idle time at
the head of its queue (semaphore wait plus the static hand-off overhead).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .engines import COMPUTE_ENGINES

__all__ = ["Instruction", "Dependency", "instructions", "engine_of", "parse_op", "op_name",
           "COMPUTE_ENGINES"]


@dataclass(frozen=True, slots=True)
class Instruction:
    """One executed instruction on one device, attributed to its kernel and source."""
    device: int
    chip: int
    core: int
    queue: str                 # "tensor" | "vector" | "scalar" | "gpsimd" | "dma<i>"
    index: int                 # position in the kernel's instruction list (-1: unknown)
    opcode: str                # instruction class, e.g. "NcMatmul"
    kernel: str                # kernel (fused region) name, e.g. "dot_general.0"
    ops: tuple[str, ...]       # the kernel's source ops: "dot_general at f.py:12"
    start_ns: float
    end_ns: float
    wait_start_ns: float       # reached the head of its queue
    bytes: int = 0             # DMA: bytes moved
    hbm_bytes: int = 0         # DMA: bytes read from plus written to HBM
    descriptor_bytes: int = 0  # DMA: contiguous bytes per descriptor (per partition)
    flops: int = 0             # TensorE FLOPs
    waits: tuple[tuple[str, int], ...] = ()
    waited_on: str | None = None   # the queue whose semaphore released it last
    line: str = ""             # a hand-written kernel's source line of this instruction

    @property
    def engine(self) -> str:
        return engine_of(self.queue)

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns

    @property
    def idle_ns(self) -> float:
        """Time at the head of its queue before it started (semaphore wait)."""
        return max(0.0, self.start_ns - self.wait_start_ns)

    @property
    def op(self) -> str:
        """The JAX op kind of the kernel's dominant source op ("dot_general"): a fused
        kernel lists the op doing the most work first (`lower.fusion.dominant_first`)."""
        return parse_op(self.ops[0])[0] if self.ops else ""

    @property
    def source(self) -> str:
        """The instruction's own line in a hand-written kernel ("norm.py:31"), else the
        source line of the kernel's dominant source op ("f.py:12")."""
        if self.line:
            return self.line
        return parse_op(self.ops[0])[1] if self.ops else ""

    @property
    def op_name(self) -> str:
        """JAX's name for the kernel's dominant source op, with its scopes
        ("jit(f)/attention/dot_general")."""
        return op_name(self.ops[0]) if self.ops else ""


@dataclass(frozen=True, slots=True)
class Dependency:
    """A semaphore wait: `consumer` waited for `producer` (the count-th instruction
    of the waited-on queue) to finish."""
    producer: Instruction
    consumer: Instruction


def engine_of(queue: str) -> str:
    return "dma" if queue.startswith("dma") else queue


def parse_op(label: str) -> tuple[str, str]:
    """"dot_general at /p/f.py:12 [jit(f)/dot_general]" -> ("dot_general", "/p/f.py:12")."""
    head = _split_name(label)[0]
    kind, sep, loc = head.partition(" at ")
    return kind, (loc if sep else "")


def op_name(label: str) -> str:
    """The JAX op name of a kernel's source-op label ("jit(f)/attention/dot_general"),
    "" when the program carried none."""
    return _split_name(label)[1]


def _split_name(label: str) -> tuple[str, str]:
    """(kind and location, JAX op name) of a label; the name is the trailing "[...]"."""
    if label.endswith("]") and " [" in label:
        head, _, name = label.rpartition(" [")
        return head, name[:-1]
    return label, ""


def instructions(record, spec=None) -> tuple[list[Instruction], list[Dependency]]:
    """The instructions of one `KernelRecord` in issue order, and their semaphore
    dependencies. `spec` (a CoreSpec) prices DMA descriptors; optional."""
    kernel = getattr(record, "kernel", None)
    by_queue = _program_order(kernel)
    seen: dict[str, int] = {}
    out, ends = [], {}
    for ev in record.events:
        n = seen.get(ev.queue, 0)
        seen[ev.queue] = n + 1
        entry = _nth(by_queue, ev.queue, n)
        out.append(_instruction(record, ev, entry, spec))
        ends.setdefault(ev.queue, []).append(len(out) - 1)
    out = [_attribute_wait(i, out, ends) for i in out]
    return out, _dependencies(out, ends)


def _program_order(kernel) -> dict[str, list[tuple[int, object]]]:
    by_queue: dict[str, list[tuple[int, object]]] = {}
    for i, instr in enumerate(getattr(kernel, "instructions", ()) or ()):
        by_queue.setdefault(instr.queue, []).append((i, instr))
    return by_queue


def _nth(by_queue, queue: str, n: int):
    entries = by_queue.get(queue, ())
    return entries[n] if n < len(entries) else (-1, None)


def _instruction(record, ev, entry, spec) -> Instruction:
    index, instr = entry
    waits = tuple(getattr(instr, "waits", ()) or ())
    dma = ev.queue.startswith("dma")
    return Instruction(
        device=record.device, chip=getattr(record, "chip", 0), core=ev.core,
        queue=ev.queue, index=index, opcode=ev.opcode, kernel=record.name,
        ops=tuple(record.ops), start_ns=ev.start_ns, end_ns=ev.end_ns,
        wait_start_ns=ev.wait_start_ns, bytes=int(ev.bytes),
        hbm_bytes=int(getattr(instr, "hbm_bytes", 0)) if dma else 0,
        descriptor_bytes=_descriptor_bytes(instr, ev, spec) if dma else 0,
        flops=int(ev.flops), waits=waits, line=_line(record, index))


def _line(record, index: int) -> str:
    lines = getattr(getattr(record, "kernel", None), "lines", None)
    return lines[index] if lines and 0 <= index < len(lines) else ""


def _descriptor_bytes(instr, ev, spec) -> int:
    """Contiguous bytes per DMA descriptor, as the DMA model charges them."""
    if instr is None:
        return int(ev.bytes)
    chunk = getattr(instr, "chunk_bytes", None)
    if chunk is not None:
        # DmaTranspose moves whole blocks (chunk_bytes = inf): one descriptor for all.
        return int(min(chunk, max(int(ev.bytes), int(getattr(instr, "nbytes", 0)))))
    if spec is not None:
        try:
            from jax_trn.hw import costs
            return int(costs.dma_shape(instr, spec)[0])
        except (AttributeError, TypeError, ValueError, KeyError):
            pass            # an instruction the DMA model's shape does not know
    tiles = [v for v in (getattr(instr, "src", None), getattr(instr, "dst", None))
             if hasattr(v, "bytes_per_partition")]
    return int(min(t.bytes_per_partition for t in tiles)) if tiles else int(ev.bytes)


def _met(wait: tuple[str, int], out: list[Instruction], ends) -> Instruction | None:
    """The instruction whose completion satisfies semaphore wait `(queue, count)`."""
    queue, count = wait
    positions = ends.get(queue, ())
    return out[positions[count - 1]] if 0 < count <= len(positions) else None


def _attribute_wait(instr: Instruction, out, ends) -> Instruction:
    if instr.start_ns <= instr.wait_start_ns or not instr.waits:
        return instr
    last, queue = -1.0, None
    for w in instr.waits:
        producer = _met(w, out, ends)
        if producer is not None and producer.end_ns > last:
            last, queue = producer.end_ns, w[0]
    if queue is None or last < instr.wait_start_ns:
        return instr
    return replace(instr, waited_on=queue)


def _dependencies(out: list[Instruction], ends) -> list[Dependency]:
    deps = []
    for consumer in out:
        for w in consumer.waits:
            producer = _met(w, out, ends)
            if producer is not None and w[0] != consumer.queue:
                deps.append(Dependency(producer, consumer))
    return deps
