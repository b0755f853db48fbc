#!/usr/bin/env python3
"""One parm.torch.MoE layer under each schedule, side by side, timed; and the same maths in
plain PyTorch (bench/torch_moe_layer.py's layer, every expert on every rank) run the same way.

    mpirun -np 2 /usr/bin/python3 examples/torch_moe_layer.py --ep 2
    (this machine: scripts/parmrun's variables, e.g.
     OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \\
       mpirun -np 2 --oversubscribe --bind-to none /usr/bin/python3 examples/torch_moe_layer.py --ep 2)

Timed as `parm bench-layer` times the C++ layer, so the numbers compare: per pass a
barrier, the forward, a barrier, the backward of out with gradient dout and of l_aux with
0.01 (torch.autograd.backward); each of the two times is the max over ranks of that pass,
and the medians over --iters passes are printed (total = forward + backward). Defaults: the
reference configuration T 1024 per rank, M 512, H 2048, E 8, k 2, f 1.2. With the package
built but not installed, set PYTHONPATH=build/python.

The three timings of issue 17 in one go (2 ranks, the reference configuration; compare them
as ratios within one run, interleaved, on a shared machine):
    scripts/parmrun -n 2 -- bench-layer --ep 2 --tokens 1024 --model-dim 512 --hidden 2048 \
        --experts 8 --topk 2 --capacity-factor 1.2 --schedule s2 --fuse off --iters 8 --warmup 2
    mpirun -np 2 ... examples/torch_moe_layer.py --ep 2 --runs s2:off,plain --iters 8 --warmup 2
and the binding's own overhead, in one process (--ab s2:off).

The torch.distributed backend against Parm's MPI (docs/torch.md), both in one mpirun job
(torch's gloo started beside MPI), runs interleaved per layer; the "comm" column is the time
the layer's collectives took (from issue to completion, summed over the pass's collectives,
per pass, this rank; the timing barriers excluded):
    mpirun -np 2 ... examples/torch_moe_layer.py --ep 2 --runs s2:off,s2:on --backend both

Threads: run it with OMP_NUM_THREADS set as for `parm bench-layer` (scripts/parmrun sets 1
per rank). torch's and Parm's GEMMs share the process's OpenMP runtime; the line "# threads"
says what torch runs with.
"""
import argparse
import os
import statistics
import sys
import time

import torch

import parm
import parm.launch
import parm.torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import torch_moe_layer as plain  # noqa: E402  (bench/: the plain-PyTorch layer)


def barrier():
    parm.allreduce_sum(torch.zeros(1))


def max_over_ranks(ms):
    """Per pass, the max over ranks of this rank's times ms (one per pass)."""
    world, rank = parm.world_size(), parm.rank()
    t = torch.zeros(len(ms), world)
    t[:, rank] = torch.tensor(ms)
    parm.allreduce_sum(t)
    return t.max(dim=1).values.tolist()


def time_passes(forward, backward, iters, warmup):
    """Medians (ms) of the forward and of the backward, each the max over ranks per pass."""
    fwd, bwd = [], []
    for i in range(warmup + iters):
        barrier()
        t0 = time.perf_counter()
        y = forward()
        t1 = time.perf_counter()
        barrier()
        t2 = time.perf_counter()
        backward(y)
        t3 = time.perf_counter()
        if i >= warmup:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t3 - t2) * 1e3)
    return statistics.median(max_over_ranks(fwd)), statistics.median(max_over_ranks(bwd))


def backward_of(dout):
    dl_aux = torch.tensor(0.01)  # what `parm bench-layer` passes as dLoss/dl_aux

    def backward(y):
        out, l_aux = y
        torch.autograd.backward([out, l_aux], [dout, dl_aux])
    return backward


def report(label, fwd, bwd, extra=""):
    if parm.rank() == 0:
        print(f"{label:<27} {fwd:9.2f} {bwd:9.2f} {fwd + bwd:9.2f}   torch threads "
              f"{torch.get_num_threads()}{extra}", flush=True)


def layer_comm_ms(passes):
    """The layer's collectives' time per pass (ms, this rank) since the last reset: every
    group's counters but the world's (the timing barriers run there)."""
    us = sum(v[2] for key, v in parm._core.comm_stats().items()
             if not key.startswith("world."))
    return us / 1e3 / passes


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
    ap.add_argument("--ab", metavar="SCHEDULE:FUSE",
                    help="instead: the binding's overhead in this process, passes alternating "
                         "between parm.torch.MoE and its C++ layer driven directly (tensors "
                         "allocated once, no autograd: what `parm bench-layer` runs)")
    ap.add_argument("--backend", default="mpi", choices=["mpi", "torch", "both"],
                    help="parm.init's backend; both: each run over MPI, then over "
                         "torch.distributed (gloo, started beside MPI)")
    ap.add_argument("--runs", default="all",
                    help="comma-separated schedule:fuse pairs (e.g. s2:off,s2:on), 'plain' for "
                         "the plain-PyTorch layer, or 'all' (every schedule of the layout, "
                         "then plain)")
    a = ap.parse_args()

    backends = ["mpi", "torch"] if a.backend == "both" else [a.backend]
    if a.backend == "mpi":
        parm.init(mp=a.mp, ep=a.ep, esp=a.esp, backend="mpi")
    else:
        if a.backend == "both":
            parm.init(backend="mpi")  # MPI first (the launcher is mpirun)
        parm.launch.init_process_group("gloo")
        parm.init(mp=a.mp, ep=a.ep, esp=a.esp, backend=backends[0])
    root = parm.rank() == 0
    # T per MP group: the MP group's ranks share its tokens (T per rank x N_MP).
    T = a.tokens * a.mp
    gen = torch.Generator().manual_seed(1 + parm.rank() // a.mp)
    x = torch.randn(T, a.model_dim, generator=gen)
    dout = torch.randn(T, a.model_dim, generator=gen)

    lay = parm.layout()
    if a.runs == "all":
        runs = [("s1", "off"), ("s1", "on"), ("s2", "off"), ("s2", "on")]
        if lay["mp"] == 1 or lay["esp"] == 1 or lay["esp"] == lay["mp"]:
            runs.insert(0, ("baseline", "off"))
        runs.append(("plain", None))
    else:
        runs = [tuple(r.split(":")) if r != "plain" else ("plain", None)
                for r in a.runs.split(",")]
    if root:
        print(f"# layout {lay}, T {T} per MP group, M {a.model_dim}, H {a.hidden}, "
              f"E {a.experts}, k {a.topk}, f {a.capacity_factor}; median of {a.iters} "
              f"passes; ms = median over passes of the max over ranks", flush=True)
        print(f"# threads: torch {torch.get_num_threads()}, OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS', '(unset)')}", flush=True)
        if not a.ab:
            print(f"{'layer':<27} {'forward':>9} {'backward':>9} {'total':>9}")
    if a.ab:
        ab_overhead(a, x, dout, *a.ab.split(":"))
        return
    for schedule, fuse in runs:
        if schedule == "plain":
            run_plain(a, x, dout)
            continue
        for backend in backends:
            if len(backends) > 1:
                parm.init(mp=a.mp, ep=a.ep, esp=a.esp, backend=backend)
            moe = parm.torch.MoE(a.model_dim, a.hidden, a.experts, topk=a.topk,
                                 capacity_factor=a.capacity_factor, schedule=schedule,
                                 fuse=fuse)

            def forward():
                for p in moe.parameters():  # as optimizer.zero_grad(set_to_none=True) does
                    p.grad = None
                out = moe(x)
                return out, moe.l_aux

            parm._core.reset_comm_stats()
            fwd, bwd = time_passes(forward, backward_of(dout), a.iters, a.warmup)
            comm = layer_comm_ms(a.iters + a.warmup)
            # schedule_used: what ran ("+fused" only where the schedule has a collective to
            # fuse on this layout).
            report(f"parm {schedule} fuse {fuse} {parm.backend()}", fwd, bwd,
                   f"   ran {moe.schedule_used}   comm {comm:.2f} ms/pass (rank 0)")


def ab_overhead(a, x, dout, schedule, fuse):
    """parm.torch.MoE against the same C++ layer driven through parm._core directly, pass
    by pass alternating (which goes first alternates too), so that the machine's load
    changes both alike; prints both medians and the median of the per-pass ratios."""
    moe = parm.torch.MoE(a.model_dim, a.hidden, a.experts, topk=a.topk,
                         capacity_factor=a.capacity_factor, schedule=schedule, fuse=fuse)
    layer = moe._layer_for(x.shape[0])
    names = ("wg", "w1", "b1", "w2", "b2")
    params = [getattr(moe, n).detach() for n in names]
    grads = [torch.zeros_like(p) for p in params]
    out, dx = torch.empty_like(x), torch.empty_like(x)
    cap = lambda t: t.__dlpack__()  # noqa: E731  (borrowed: reusable)
    caps_p, caps_g = [cap(t) for t in params], [cap(t) for t in grads]
    cap_x, cap_out, cap_dout, cap_dx = cap(x), cap(out), cap(dout), cap(dx)
    module_backward = backward_of(dout)

    def module_pass():
        for p in moe.parameters():
            p.grad = None
        barrier()
        t0 = time.perf_counter()
        y = (moe(x), moe.l_aux)
        t1 = time.perf_counter()
        barrier()
        t2 = time.perf_counter()
        module_backward(y)
        return (t1 - t0) * 1e3, (time.perf_counter() - t2) * 1e3

    def raw_pass():
        barrier()
        t0 = time.perf_counter()
        layer.set_params(*caps_p)
        layer.forward(cap_x, cap_out)
        t1 = time.perf_counter()
        barrier()
        t2 = time.perf_counter()
        layer.set_grads(*caps_g)
        layer.backward(layer.forwards(), cap_dout, 0.01, cap_dx)
        return (t1 - t0) * 1e3, (time.perf_counter() - t2) * 1e3

    mod, raw = [], []
    for i in range(a.warmup + a.iters):
        first, second = (module_pass, raw_pass) if i % 2 == 0 else (raw_pass, module_pass)
        r1, r2 = first(), second()
        m, r = (r1, r2) if i % 2 == 0 else (r2, r1)
        if i >= a.warmup:
            mod.append(m[0] + m[1])
            raw.append(r[0] + r[1])
    mod, raw = max_over_ranks(mod), max_over_ranks(raw)
    ratios = [m / r for m, r in zip(mod, raw)]
    if parm.rank() == 0:
        print(f"# {schedule} fuse {fuse}, forward+backward, median of {a.iters} passes each, "
              f"alternating; ms = max over ranks", flush=True)
        print(f"{'C++ layer via _core':<21} {statistics.median(raw):9.2f}")
        print(f"{'parm.torch.MoE':<21} {statistics.median(mod):9.2f}")
        print(f"{'ratio (per pass)':<21} {statistics.median(ratios):9.3f}   min "
              f"{min(ratios):.3f} max {max(ratios):.3f}", flush=True)


def run_plain(a, x, dout):
    """The plain-PyTorch layer of the same maths, every expert on every rank, on its T
    tokens."""
    T = x.shape[0]
    params = plain.init_params(a.model_dim, a.hidden, a.experts, "cpu", torch.float32,
                               torch.Generator().manual_seed(0))
    C = plain.capacity(a.topk, a.capacity_factor, T, a.experts)

    def forward_plain():
        out, l_aux, _ = plain.moe_forward(x, params, a.topk, C)
        return out, l_aux

    fwd, bwd = time_passes(forward_plain, backward_of(dout), a.iters, a.warmup)
    report("plain PyTorch", fwd, bwd)


if __name__ == "__main__":
    main()
