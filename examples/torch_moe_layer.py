#!/usr/bin/env python3
"""One parm.torch.MoE layer under each schedule, side by side, timed; and the same maths in
plain PyTorch (bench/torch_moe_layer.py's layer, every expert on every rank) run the same way.

    mpirun -np 2 /usr/bin/python3 examples/torch_moe_layer.py --ep 2
    (this machine: scripts/parmrun's variables, e.g.
     OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \\
       mpirun -np 2 --oversubscribe --bind-to none /usr/bin/python3 examples/torch_moe_layer.py --ep 2)

Each pass is a forward, then a backward of (out * dout).sum() + 0.01 * l_aux (as `parm
bench-layer`), after a barrier; the median over --iters passes of rank 0 is printed, per
schedule. Defaults: the reference configuration T 1024 per rank, M 512, H 2048, E 8, k 2,
f 1.2. With the package built but not installed, set PYTHONPATH=build/python.
"""
import argparse
import os
import statistics
import sys
import time

import torch

import parm
import parm.torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import torch_moe_layer as plain  # noqa: E402  (bench/: the plain-PyTorch layer)


def barrier():
    parm.allreduce_sum(torch.zeros(1))


def time_passes(run, iters, warmup):
    times = []
    for i in range(warmup + iters):
        barrier()
        t0 = time.perf_counter()
        run()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--esp", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=1024, help="T per rank")
    ap.add_argument("--model-dim", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--capacity-factor", default="1.2")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()

    parm.init(mp=a.mp, ep=a.ep, esp=a.esp)
    root = parm.rank() == 0
    # T per MP group: the MP group's ranks share its tokens (T per rank x N_MP).
    T = a.tokens * a.mp
    gen = torch.Generator().manual_seed(1 + parm.rank() // a.mp)
    x = torch.randn(T, a.model_dim, generator=gen)
    dout = torch.randn(T, a.model_dim, generator=gen)

    lay = parm.layout()
    runs = [("s1", "off"), ("s1", "on"), ("s2", "off"), ("s2", "on")]
    if lay["mp"] == 1 or lay["esp"] == 1 or lay["esp"] == lay["mp"]:
        runs.insert(0, ("baseline", "off"))
    if root:
        print(f"# layout {lay}, T {T} per MP group, M {a.model_dim}, H {a.hidden}, "
              f"E {a.experts}, k {a.topk}, f {a.capacity_factor}; median of {a.iters} "
              f"forward+backward passes, rank 0", flush=True)
        print(f"{'layer':<21} {'ms':>9}")
    for schedule, fuse in runs:
        moe = parm.torch.MoE(a.model_dim, a.hidden, a.experts, topk=a.topk,
                             capacity_factor=a.capacity_factor, schedule=schedule, fuse=fuse)

        def run():
            out = moe(x)
            (out * dout).sum().add(0.01 * moe.l_aux).backward()

        ms = time_passes(run, a.iters, a.warmup)
        if root:
            # schedule_used: what ran ("+fused" only where the schedule has a collective to
            # fuse on this layout).
            label = f"parm {schedule} fuse {fuse}"
            print(f"{label:<21} {ms:9.2f}   ran {moe.schedule_used}", flush=True)

    # The plain-PyTorch layer of the same maths, every expert on every rank, on its T tokens.
    params = plain.init_params(a.model_dim, a.hidden, a.experts, "cpu", torch.float32,
                               torch.Generator().manual_seed(0))
    C = plain.capacity(a.topk, a.capacity_factor, T, a.experts)

    def run_plain():
        out, l_aux, _ = plain.moe_forward(x, params, a.topk, C)
        (out * dout).sum().add(0.01 * l_aux).backward()

    ms = time_passes(run_plain, a.iters, a.warmup)
    if root:
        print(f"{'plain PyTorch':<21} {ms:9.2f}", flush=True)


if __name__ == "__main__":
    main()
