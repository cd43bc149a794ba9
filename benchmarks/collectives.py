"""Published collective-communication claims vs the simulated interconnect (trainium-hardware.md §5.3).

    python benchmarks/collectives.py [--no-scale]

Claims, and what each row compares (the sources give no message sizes; we sweep them):
  1. Trn3 NeuronSwitch vs torus [SEED-AIM201]: "all-gather latency up to 6x lower, all-reduce
     up to 2x lower". 64 Trainium3 chips (the Gen1 UltraServer: 4 servers x 16 chips on
     NeuronSwitch-v1) vs the same 64 chips as a 4x4x4 3D torus (the Trn2 UltraServer's
     shape) with the same NeuronLink bandwidth per chip split over its 6 links. One rank
     per chip, default algorithm on each (switch: mesh; torus: the §5.3 size rule; a
     small all-reduce as the single-step mesh on both). The talk (seed 000) speaks of
     latency for both: "all-gather ... up to 6x the reduction in latency, and for
     all-reduce, a latency improvement of up to 2x", so the claim is judged on the
     smallest message (1 KiB per rank, latency-bound). The switch traversal latency is
     not published (§11) and is derived from the all-gather figure (see
     jax_trn/hw/spec.py, `LinkSpec.switch_hop_ns`), so that row holds by construction;
     the all-reduce row is the test. The sweep over 1 KiB .. 256 MiB is printed too:
     at bandwidth-bound sizes the ratio is the links' bandwidth ratio, not a latency.
  2. 2D-ring vs flat-ring all-reduce at 512 Trainium1 chips [SEED-2022]: the slide shows
     "-75%" time at 512 chips (= 4x faster). 32 trn1.32xlarge (4x4 torus each) on EFA
     (800 Gbps per instance, ~15 us a hop), one rank per chip; flat ring = one ring through
     all 512 chips; 2D ring = ring inside each node, then ring across nodes. Headline size:
     BERT-Large gradients in BF16 (340 M parameters, 680 MB; the slide's workload).
  3. Large all-reduce bus bandwidth on a 16-chip Trn2 torus (trn2.48xlarge), one rank per
     chip, >= 85% of the link-bound optimum (4 links x 128 GB/s per direction per chip).
Then the scale of the model: wall time for 1152 NeuronCores (trn3-ultraserver) and 512
Trn1 chips, timing only and with numerics. Simulated figures are deterministic.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from jax_trn.collectives import collective_time, run_collective
from jax_trn.hw.topology import Topology
from jax_trn.config import get_system

KIB, MIB = 1 << 10, 1 << 20
SIZES = [KIB * 4 ** k for k in range(10)]          # 1 KiB .. 256 MiB per rank (output)


def _row(claim, compared, published, simulated, ok):
    print(f"| {claim} | {compared} | {published} | {simulated} | {'yes' if ok else 'NO'} |")


def _within(sim, pub, tol=0.25):
    return abs(sim / pub - 1) <= tol


def switch_vs_torus():
    sw, to = Topology.switch("trn3", 4, 16), Topology.torus("trn3", (4, 4, 4))
    group = [[c * 8 for c in range(64)]]
    sweep = {}
    for kind in ("all_gather", "all_reduce"):
        for size in SIZES:
            elems = size // 4 // (64 if kind == "all_gather" else 1)
            a = collective_time(kind, (elems,), np.float32, group, sw)
            b = collective_time(kind, (elems,), np.float32, group, to)
            sweep.setdefault(kind, []).append((size, a, b, b.total_ns / a.total_ns))
    return sweep


def flat_vs_2d(size):
    topo = Topology.cluster("trn1", nodes=32)
    group = [list(range(0, topo.num_devices, topo.cores_per_chip))]
    flat = collective_time("all_reduce", (size // 2,), np.float16, group, topo, "ring")
    two = collective_time("all_reduce", (size // 2,), np.float16, group, topo, "ring2d")
    return flat, two


def trn2_busbw(size):
    topo = get_system("trn2.48xlarge").interconnect()
    t = collective_time("all_reduce", (size // 2,), np.float16, [[c * 8 for c in range(16)]], topo)
    optimum = 4 * topo.link_bw[0]
    return t, t.bus_bandwidth / optimum


def claims():
    print("| claim | what is compared | published | simulated | within goal |")
    print("|---|---|---|---|---|")
    sweep = switch_vs_torus()
    for kind, pub, role in (("all_gather", 6.0, "calibration: the switch hop is derived from it"),
                            ("all_reduce", 2.0, "prediction")):
        size, a, b, ratio = sweep[kind][0]
        _row(f"Trn3 NeuronSwitch vs torus, {kind.replace('_', '-')} latency",
             f"64 chips, {size // KIB} KiB per rank: switch ({a.algorithm.split()[1]}) "
             f"{a.total_ns / 1e3:.1f} us vs 4x4x4 torus ({b.algorithm.split()[1]}) "
             f"{b.total_ns / 1e3:.1f} us ({role})",
             f"up to {pub:g}x lower", f"{ratio:.2f}x lower", _within(ratio, pub))
    bert = 340_000_000 * 2
    flat, two = flat_vs_2d(bert)
    speedup = flat.total_ns / two.total_ns
    cut = 1 - 1 / speedup
    _row("2D-ring vs flat-ring all-reduce, 512 Trn1", f"680 MB (BERT-L bf16 grads): flat {flat.total_ns / 1e6:.1f} ms, "
         f"2D {two.total_ns / 1e6:.1f} ms; judged on the time cut (as a speed ratio: "
         f"{speedup:.1f}x vs 4.0x, {'within' if _within(speedup, 4.0) else 'outside'} 25%)",
         "-75% time", f"-{cut * 100:.0f}% time", _within(cut, 0.75))
    for size in (256 * MIB, 1024 * MIB):
        t, frac = trn2_busbw(size)
        _row("large all-reduce bus bandwidth, 16-chip Trn2 torus",
             f"{size // MIB} MiB, {t.algorithm.split()[1]}: {t.bus_bandwidth:.0f} GB/s vs 512 GB/s link-bound",
             ">= 85%", f"{frac * 100:.1f}%", frac >= 0.85)
    print()
    print("Note: at 1 KiB both sides are latency-bound. All-gather: a 1.3 us launch, then the mesh's\n"
          "longest route, 6 NeuronLink hops of 1.5 us on the torus vs one switch traversal. All-reduce:\n"
          "the single-step mesh on both (one network latency; §5.3 [CC-INTER]), then a local reduce of\n"
          "64 buffers, a chain of 5 dma_computes (16 sources each, §3.4) that the switch does not\n"
          "shorten, hence about 2x. At larger sizes the ratio is the bandwidth ratio: the switch port\n"
          "carries a chip's whole NeuronLink bandwidth, a torus ring level 2 of its 6 links and an RDH\n"
          "step one link pair.")
    for kind in ("all_gather", "all_reduce"):
        size, _, b, ratio = max(sweep[kind], key=lambda r: r[3])
        print(f"  largest {kind} ratio over the sweep: {ratio:.2f}x at {size // KIB} KiB "
              f"(torus {b.algorithm.split()[1]}; bandwidth-bound, not the latency claim)")
    print()
    print("Sweeps (ratio = torus / switch time at each per-rank size, or flat / 2D at each size):")
    for kind, rows in sweep.items():
        print(f"  {kind:10s} " + "  ".join(f"{s // KIB}K:{r:.2f}" for s, _, _, r in rows))
    print("  512-chip   " + "  ".join(
        f"{s // MIB}M:{f.total_ns / t.total_ns:.2f}" for s in (MIB, 16 * MIB, 256 * MIB, 1024 * MIB)
        for f, t in [flat_vs_2d(s)]))


def scale():
    print()
    print("| scale case | algorithm | simulated | wall (timing only) | wall (with numerics) |")
    print("|---|---|---|---|---|")
    us = get_system("trn3-ultraserver").interconnect()
    everyone = [list(range(us.num_devices))]
    for kind, elems in (("all_reduce", 64 * 1152), ("all_gather", 64), ("reduce_scatter", 64 * 1152),
                        ("all_to_all", 64 * 1152)):
        t0 = time.perf_counter()
        t = collective_time(kind, (elems,), np.float32, everyone, us)
        t1 = time.perf_counter()
        xs = {d: np.full(elems, d % 7, np.float32) for d in everyone[0]}
        run_collective(kind, xs, everyone, us)
        t2 = time.perf_counter()
        print(f"| trn3-ultraserver 1152 cores {kind}, {elems * 4} B/rank | {t.algorithm.split()[1]} | "
              f"{t.total_ns / 1e3:.1f} us | {t1 - t0:.2f} s | {t2 - t1:.2f} s |")
    cl = Topology.cluster("trn1", nodes=32)
    group = [list(range(0, cl.num_devices, 2))]
    for algo in ("ring", "ring2d"):
        t0 = time.perf_counter()
        t = collective_time("all_reduce", (1 << 20,), np.float32, group, cl, algo)
        t1 = time.perf_counter()
        run_collective("all_reduce", {d: np.ones(1 << 14, np.float32) for d in group[0]}, group, cl, algo)
        t2 = time.perf_counter()
        print(f"| 512 Trn1 chips all_reduce 4 MiB (numerics: 64 KiB) | {algo} | {t.total_ns / 1e3:.0f} us | "
              f"{t1 - t0:.2f} s | {t2 - t1:.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-scale", action="store_true", help="skip the wall-time measurements")
    opts = parser.parse_args()
    claims()
    if not opts.no_scale:
        scale()


if __name__ == "__main__":
    main()
