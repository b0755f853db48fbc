"""The torch.distributed backend (parm.init(backend="torch"), docs/torch.md) against the MPI
backend, in one job under mpirun (CTest: 1, 2 and 4 ranks): torch.distributed (gloo) is
started beside Parm's MPI, and every case runs the same layer over both.

  - bit-identical: output, l_aux, input gradient and every parameter gradient, for every
    layout of the world size (mp, ep and esp > 1 at 4 ranks), every schedule fused and not,
    k = 1, 2, 3, with drops and dropless;
  - the counters: per pass, the same calls and bus bytes per (group, op) on both backends,
    and under a capacity factor exactly the step list's (docs/spec.md's table; the C++
    Bytes tests hold the MPI side to it);
  - the caller's groups: accepted when they form a layout (parm.group returns them), and a
    wrong size, overlapping groups, and groups no order nests are refused on every rank
    before any work, naming the group;
  - parm.backend(), parm.group(), and the bad arguments of parm.init.
Every failed check is printed and the run exits non-zero at the end.
"""
import os
import sys

import torch
import torch.distributed as dist

import parm
import parm.launch
import parm.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_torch_moe as tm  # noqa: E402  (the layouts, weights and data of the oracle suite)

M, H, E, T = tm.M, tm.H, tm.E, tm.T
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"rank {dist.get_rank()}: FAIL {what}", flush=True)


def raises(fn, what, *contains):
    try:
        fn()
    except ValueError as e:
        for c in contains:
            check(c in str(e), f"{what}: message {str(e)!r} lacks {c!r}")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: raised {type(e).__name__} ({e}), expected ValueError")
        return
    check(False, f"{what}: did not raise")


def counts(stats):
    """(calls, bus bytes) per "group.op" (the time differs run to run)."""
    return {key: v[:2] for key, v in stats.items()}


def run(layout, backend, schedule, fuse, k, f, seed):
    """One forward and backward; returns the tensors and each pass's counters."""
    parm.init(*layout, backend=backend)
    check(parm.backend() == backend, f"parm.backend() {parm.backend()} != {backend}")
    moe = parm.torch.MoE(M, H, E, topk=k, capacity_factor=f, schedule=schedule, fuse=fuse,
                         seed=seed)
    moe.load_state_dict(tm.whole_weights(seed))
    x, dout = tm.group_data(seed, parm.rank() // layout[0])
    x = x.clone().requires_grad_(True)
    parm._core.reset_comm_stats()
    out = moe(x)
    fwd = counts(parm._core.comm_stats())
    parm._core.reset_comm_stats()
    (out * dout).sum().add(tm.DL_AUX * moe.l_aux).backward()
    bwd = counts(parm._core.comm_stats())
    layer = moe._layer_for(T)
    listed = (layer.listed_bytes(False), layer.listed_bytes(True))
    tensors = {"out": out.detach(), "l_aux": moe.l_aux.detach(), "dx": x.grad,
               "dwg": moe.wg.grad}
    for n, g in moe.whole_tensors(grads=True).items():
        tensors["d" + n] = g
    return tensors, (fwd, bwd), listed


def bytes_of(stats):
    """Bus bytes per "group.op", where some moved (a group of one rank moves none; the step
    list leaves those out)."""
    return {key: b for key, (_, b) in stats.items() if b != 0}


def equivalence(world):
    cases = 0
    for layout in tm.layouts(world):
        for schedule, fuse in tm.schedules(layout):
            for k in (1, 2, 3):
                for f in ("0.5", None):  # drops (C below the load), dropless
                    name = f"layout {layout} {schedule} fuse={fuse} k={k} f={f}"
                    a, sa, listed = run(layout, "mpi", schedule, fuse, k, f, 7 + k)
                    b, sb, _ = run(layout, "torch", schedule, fuse, k, f, 7 + k)
                    for n in a:
                        check(torch.equal(a[n], b[n]),
                              f"{name}: {n} differs between mpi and torch (max |diff| "
                              f"{float((a[n] - b[n]).abs().max()):.3g})")
                    for p, (ma, mb) in enumerate(zip(sa, sb)):
                        check(ma == mb, f"{name}: {('forward', 'backward')[p]} counters mpi "
                                        f"{ma} torch {mb}")
                        if f is not None:
                            check(bytes_of(mb) == {k_: v for k_, v in listed[p].items() if v != 0},
                                  f"{name}: {('forward', 'backward')[p]} torch counters "
                                  f"{bytes_of(mb)} != the step list's {listed[p]}")
                    cases += 1
    return cases


def caller_groups(world):
    """The caller's own groups: a valid set is used as given; bad ones are refused by every
    rank before any work."""
    rank = dist.get_rank()
    if world == 4:
        # mp 2, ep 2, esp 2 under the default order: mp = esp = {0,1},{2,3}; ep = {0,2},{1,3}.
        pairs = {(0, 1): None, (2, 3): None, (0, 2): None, (1, 3): None, (1, 2): None,
                 (0, 3): None}
        for p in pairs:  # new_group is collective over the world: every rank, same order
            pairs[p] = dist.new_group(list(p))
        mp_g = pairs[(0, 1)] if rank < 2 else pairs[(2, 3)]
        ep_g = pairs[(0, 2)] if rank in (0, 2) else pairs[(1, 3)]
        parm.init(2, 2, 2, backend="torch", process_groups={"mp": mp_g, "ep": ep_g,
                                                            "esp": mp_g})
        check(parm.group("mp") is mp_g and parm.group("ep") is ep_g,
              "parm.group does not return the caller's groups")
        check(parm.group_ranks("ep") == ([0, 2] if rank in (0, 2) else [1, 3]),
              f"ep ranks {parm.group_ranks('ep')}")
        # With an order given, the groups are checked against that order only.
        raises(lambda: parm.init(2, 2, 2, backend="torch", order="mp-ep-esp-dp-pp",
                                 process_groups={"ep": ep_g}),
               "caller ep groups against another order", "process_groups['ep']", "[0, 1]")
        # Without one, the first order that nests them: ep = {0,2},{1,3} with esp 1 is the
        # order with edp inside ep (mp-esp-dp-ep-pp), and the layer runs over them.
        parm.init(2, 2, 1, backend="torch", process_groups={"ep": ep_g})
        check(parm.group_ranks("ep") == ([0, 2] if rank in (0, 2) else [1, 3]),
              f"ep groups of another order not adopted: {parm.group_ranks('ep')}")
        check(parm.layout()["order"] != parm._core.DEFAULT_ORDER, "order not found")
        moe = parm.torch.MoE(M, H, E, topk=2, schedule="s2", fuse="on")
        y = moe(torch.randn(T, M, generator=torch.Generator().manual_seed(parm.rank() // 2)))
        check(bool(torch.isfinite(y).all()), "a layer over the caller's groups")
        # Wrong size.
        raises(lambda: parm.init(1, 4, 1, backend="torch", process_groups={"ep": ep_g}),
               "ep group of 2 with ep=4", "process_groups['ep']", "2 ranks", "ep=4")
        # Overlapping: ranks 0, 1 say {0,1}; rank 2 says {1,2}; rank 3 says {2,3}.
        ov = {0: pairs[(0, 1)], 1: pairs[(0, 1)], 2: pairs[(1, 2)], 3: pairs[(2, 3)]}[rank]
        raises(lambda: parm.init(2, 1, 1, backend="torch", process_groups={"mp": ov}),
               "overlapping mp groups", "process_groups['mp']", "overlap")
        # Inconsistent: {0,3},{1,2} is no layout's ep group under any order.
        odd = pairs[(0, 3)] if rank in (0, 3) else pairs[(1, 2)]
        raises(lambda: parm.init(1, 2, 1, backend="torch", process_groups={"ep": odd}),
               "ep groups no order nests", "process_groups['ep']", "[0, 3]")
    raises(lambda: parm.init(backend="torch", process_groups={"tp": dist.group.WORLD}),
           "unknown group key", "tp", "valid keys")
    raises(lambda: parm.init(backend="mpi", process_groups={"ep": dist.group.WORLD}),
           "process_groups under mpi", "backend='torch'")
    raises(lambda: parm.init(backend="nccl"), "unknown backend", "nccl", "'torch'")
    raises(lambda: parm.init(mp=world + 1, backend="torch"), "invalid layout", "mp")
    parm.init(backend="mpi")
    check(parm.backend() == "mpi", "backend mpi")
    try:
        parm.group("ep")
        check(False, "parm.group under mpi did not raise")
    except RuntimeError as e:
        check("allreduce_sum" in str(e), f"parm.group under mpi: {e}")
    parm.init()  # auto: torch.distributed is initialized
    check(parm.backend() == "torch", "backend auto with torch.distributed is not torch")
    raises(lambda: parm.group("xp"), "parm.group('xp')", "xp", "edp")


def main():
    parm.init(backend="mpi")  # MPI first (the job's launcher is mpirun), then torch beside it
    parm.launch.init_process_group("gloo")
    world = dist.get_world_size()
    check(world == parm.world_size(), "torch and MPI worlds differ")
    caller_groups(world)
    cases = equivalence(world)
    ok = not failures
    if dist.get_rank() == 0:
        print(f"test_torch_backend: world {world}: {cases} cases, "
              f"{'passed' if ok else f'{len(failures)} failures'}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
