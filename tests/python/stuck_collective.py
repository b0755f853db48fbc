"""A real stuck collective under 2 ranks: rank 1 does not enter the layer's forward (it is
stuck elsewhere, here in a long sleep); rank 0's forward must raise parm.TimeoutError after
init(timeout=2), naming its rank, the group, the collective and its bytes, and the job must
then end (rank 0's exit aborts it, killing rank 1) instead of hanging.

CTest (2 ranks) passes on rank 0's "stuck_collective: passed" line; the job's exit code is
1 by design (MPI_Abort), and a job that hangs runs into CTest's time limit.
"""
import re
import sys
import time

import torch

import parm
import parm.torch

M, H, E, T, K = 8, 12, 4, 16, 2
TIMEOUT_S = 2

parm.init(mp=1, ep=2, esp=1, timeout=TIMEOUT_S)
if parm.world_size() != 2:
    print(f"stuck_collective: FAIL needs 2 ranks, got {parm.world_size()}", flush=True)
    sys.exit(1)
moe = parm.torch.MoE(M, H, E, topk=K, capacity_factor="1.2", schedule="s2", fuse="off")
x = torch.randn(T, M)
if parm.rank() == 1:
    time.sleep(600)  # never reaches the forward; the job ends while this rank sleeps
    print("stuck_collective: FAIL rank 1 was not ended by rank 0's abort", flush=True)
    sys.exit(1)

# The first collective of S2 with ep 2 is the dispatch alltoall of the (E, C, M) float32
# buffer, C = ceil(k f T / E).
C = -(-K * 12 * T // (10 * E))
want = (rf"rank 0 \(group ep rank 0 of 2\): alltoall of {E * C * M * 4} bytes did not "
        rf"complete within {TIMEOUT_S} s")
try:
    moe(x)
    print("stuck_collective: FAIL the forward returned without rank 1", flush=True)
    sys.exit(1)
except parm.TimeoutError as e:
    if not isinstance(e, TimeoutError) or not re.search(want, str(e)):
        print(f"stuck_collective: FAIL message {str(e)!r} does not match {want!r}", flush=True)
        sys.exit(1)
    print(f"rank 0: parm.TimeoutError: {e}", flush=True)
print("stuck_collective: passed", flush=True)
