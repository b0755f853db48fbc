"""parm over torch.multiprocessing.spawn (parm.launch.spawn), no MPI: N ranks, ep = N, one
forward and backward of an S2 layer (fused) over torch's groups, each rank's output and
input gradient against the fp64 reference of test_torch_moe.py within its tolerance; and
parm.init before torch.distributed is initialized is refused (not a job of one per rank).
Prints "spawn_layer: passed" when every rank passed.

    spawn_layer.py N
"""
import os
import sys

import torch
import torch.distributed as dist

import parm
import parm.launch
import parm.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_torch_moe as tm  # noqa: E402

K, F, SEED = 2, "0.5", 9


def worker(rank, n):
    # Before torch.distributed exists, "auto" must refuse (MPI would make each rank a job of
    # one), naming what to call.
    try:
        parm.init(ep=n, timeout=60)
        refused = False
    except ValueError as e:
        refused = "init_process_group" in str(e)
    parm.launch.init_process_group("gloo")
    parm.init(ep=n, timeout=60)
    moe = parm.torch.MoE(tm.M, tm.H, tm.E, topk=K, capacity_factor=F, schedule="s2",
                         fuse="on", seed=SEED)
    weights = tm.whole_weights(SEED)
    moe.load_state_dict(weights)
    x, dout = tm.group_data(SEED, rank)
    x = x.clone().requires_grad_(True)
    out = moe(x)
    (out * dout).sum().add(tm.DL_AUX * moe.l_aux).backward()
    w64 = {k: t.double().requires_grad_(True) for k, t in weights.items()}
    x64 = x.detach().double().requires_grad_(True)
    ro, rl, _ = tm.reference_moe(x64, w64, K, F, 1)
    (ro * dout.double()).sum().add(tm.DL_AUX * rl).backward()
    errs = {"backend": 0.0 if parm.backend() == "torch" else 1.0,
            "auto without torch.distributed not refused": 0.0 if refused or n == 1 else 1.0,
            "out": tm.rel_err(out.detach(), ro.detach()), "dx": tm.rel_err(x.grad, x64.grad)}
    bad = torch.tensor([float(any(e > tm.TOL for e in errs.values()))])
    dist.all_reduce(bad)
    print(f"spawn_layer: rank {rank} of {n}: {errs}", flush=True)
    if rank == 0 and float(bad) == 0:
        print("spawn_layer: passed", flush=True)


if __name__ == "__main__":
    n = int(sys.argv[1])
    parm.launch.spawn(worker, n, args=(n,))
