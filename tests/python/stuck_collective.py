"""A real stuck collective: the last rank does not enter the layer's forward (it is stuck
elsewhere, here in a long sleep); every other rank's forward must raise parm.TimeoutError
after init(timeout=2), naming its rank, the group, the collective and its bytes, and the job
must then end (the failing ranks' exit ends it, killing the stuck one) instead of hanging.

    mpirun -np 2 python3 stuck_collective.py                       # MPI: rank 0's MPI_Abort
    scripts/torchrun --nproc_per_node 4 stuck_collective.py --backend torch
        # torch.distributed: each failing rank exits 1, and torchrun stops the stuck one

Each rank that raised as it should prints "stuck_collective: rank R passed"; rank 0 of a
2-rank job also prints "stuck_collective: passed" (CTest's MPI test passes on it; the torch
one runs under tests/python/run_stuck.py, which counts the lines). The job's exit code is 1
by design, and a job that hangs runs into the time limit.
"""
import re
import sys
import time

import torch

import parm
import parm.torch

M, H, E, T, K = 8, 12, 4, 16, 2
TIMEOUT_S = 2

backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "mpi"
if backend == "torch":
    import parm.launch

    world = parm.launch.init_process_group()[1]
else:
    parm.init(backend="mpi")
    world = parm.world_size()
if world not in (2, 4):
    print(f"stuck_collective: FAIL needs 2 or 4 ranks, got {world}", flush=True)
    sys.exit(1)
parm.init(mp=1, ep=world, esp=1, timeout=TIMEOUT_S, backend=backend)
moe = parm.torch.MoE(M, H, E, topk=K, capacity_factor="1.2", schedule="s2", fuse="off")
x = torch.randn(T, M)
rank = parm.rank()
if rank == world - 1:
    time.sleep(600)  # never reaches the forward; the job ends while this rank sleeps
    print("stuck_collective: FAIL the stuck rank was not ended", flush=True)
    sys.exit(1)

# The first collective of S2 with ep > 1 is the dispatch alltoall of the (E, C, M) float32
# buffer, C = ceil(k f T / E).
C = -(-K * 12 * T // (10 * E))
want = (rf"rank {rank} \(group ep rank {rank} of {world}\): alltoall of {E * C * M * 4} bytes "
        rf"did not complete within {TIMEOUT_S} s")
start = time.monotonic()
try:
    moe(x)
    print(f"stuck_collective: FAIL rank {rank}: the forward returned without the stuck rank",
          flush=True)
    sys.exit(1)
except parm.TimeoutError as e:
    waited = time.monotonic() - start
    if not isinstance(e, TimeoutError) or not re.search(want, str(e)):
        print(f"stuck_collective: FAIL message {str(e)!r} does not match {want!r}", flush=True)
        sys.exit(1)
    if waited > 3 * TIMEOUT_S + 5:
        print(f"stuck_collective: FAIL rank {rank} raised after {waited:.1f} s", flush=True)
        sys.exit(1)
    print(f"rank {rank}: parm.TimeoutError after {waited:.1f} s: {e}", flush=True)
print(f"stuck_collective: rank {rank} passed", flush=True)
if rank == 0 and world == 2:
    print("stuck_collective: passed", flush=True)
