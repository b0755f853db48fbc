"""Runs a launcher command for stuck_collective.py and checks the job as a whole: it ended
within the limit (no hang), and each of the N - 1 ranks that were not stuck printed
"stuck_collective: rank R passed". Prints "stuck_collective: passed" then.

    run_stuck.py N LIMIT_S -- <launcher command...>
"""
import subprocess
import sys
import time

n, limit = int(sys.argv[1]), float(sys.argv[2])
cmd = sys.argv[sys.argv.index("--") + 1:]
start = time.monotonic()
try:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=limit)
    out = p.stdout
except subprocess.TimeoutExpired as e:
    print((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
          else (e.stdout or ""))
    print(f"stuck_collective: FAIL the job still ran after {limit} s (a hang)")
    sys.exit(1)
print(out)
took = time.monotonic() - start
passed = [r for r in range(n - 1) if f"stuck_collective: rank {r} passed" in out]
if "stuck_collective: FAIL" in out or len(passed) != n - 1:
    print(f"stuck_collective: FAIL ranks {passed} of 0..{n - 2} passed")
    sys.exit(1)
print(f"stuck_collective: passed (job ended after {took:.1f} s, exit code {p.returncode})")
