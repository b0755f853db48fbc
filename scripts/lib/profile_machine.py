#!/usr/bin/python3
"""Whether a cost profile (`parm calibrate --out P`) was measured on this machine and build.

  scripts/lib/profile_machine.py PROFILE PARM_VERSION GEMM_BACKEND

Compares the profile's recorded machine facts (calibrate's "machine": hostname, cpu_model,
cores, onednn, parm_version) with this machine's (the version and GEMM backend as `parm info`
prints them). Prints the date it was made ("created <utc>") and one line per fact that
differs; exit status 0 when none differs, 1 when one does, 2 when the profile is unreadable.
"""
import json
import os
import socket
import sys


def cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    path, version, gemm = sys.argv[1:4]
    try:
        with open(path) as fh:
            machine = json.load(fh).get("machine", {})
    except (OSError, ValueError) as e:
        print(f"unreadable: {e}")
        return 2
    print(f"created {machine.get('created_utc', 'at an unknown date')}")
    here = {"hostname": socket.gethostname(), "cpu_model": cpu_model(),
            "cores": os.cpu_count(), "onednn": gemm, "parm_version": version}
    differs = 0
    for key, now in here.items():
        then = machine.get(key)
        if then != now:
            print(f"{key}: profile {then!r}, here {now!r}")
            differs += 1
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
