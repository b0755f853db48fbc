#!/usr/bin/python3
"""A cluster file for `parm simulate` from a profile that `parm calibrate` wrote on that cluster,
by the rule the emulated cluster files in configs/clusters/ state in their notes: per link class
the median over the collectives' fitted terms (alpha, alpha per rank, beta; inter: the
handshake), the GEMM rate and
intercept the median over the GEMM classes, the memory terms the median over the memory
classes, and the fused, eager and rendezvous terms as the profile has them.

  bench/tools/cluster_from_profile.py --profile P.json --name NAME --description TEXT
                                      [--rendezvous-per-compute R]
                                      [--out C.json]   (default: standard output)

--rendezvous-per-compute R sets step_sync_per_compute (for profiles taken before `calibrate`
applied the value it measures: their step_sync.source names it).

Nodes and devices per node come from the profile's machine block (ranks / nodes). The file is
written whole or not at all (a temporary file renamed into place). Refuses a profile without
the terms a cluster file needs, naming what is missing.
"""
import argparse, json, math, os, statistics as st, sys, tempfile


def die(msg):
    print(f"cluster_from_profile.py: {msg}", file=sys.stderr)
    sys.exit(2)


def number(block, key, default, where):
    """block[key] (default where absent) as a finite number >= 0, else a clear refusal."""
    x = block.get(key, default)
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        die(f"{where}.{key} is {x!r}: need a finite number >= 0")
    return x


def median_of(table, key, where):
    values = [number(v, key, None, f"{where}.{name}") for name, v in table.items()
              if isinstance(v, dict) and key in v]
    if not values:
        die(f"{where}: no entry has '{key}' (a profile from `parm calibrate` has one per class)")
    return st.median(values)


def block_of(profile, key):
    b = profile.get(key, {})
    if not isinstance(b, dict):
        die(f"{key} is {type(b).__name__}: need an object (as `parm calibrate` writes it)")
    return b


def link(profile, name):
    ops = block_of(profile, "collectives").get(name)
    if not isinstance(ops, dict) or not ops:
        die(f"the profile has no collectives.{name} (valid: a profile `parm calibrate` wrote)")
    where = f"collectives.{name}"
    out = {"alpha_us": round(median_of(ops, "alpha_us", where), 1)}
    if any("alpha_per_rank_us" in v for v in ops.values()):
        out["alpha_per_rank_us"] = round(median_of(ops, "alpha_per_rank_us", where), 1)
    out["beta_us_per_byte"] = float(f"{median_of(ops, 'beta_us_per_byte', where):.5g}")
    if name == "inter" and any(isinstance(v, dict) and "handshake_us" in v for v in ops.values()):
        out["handshake_us"] = round(median_of(ops, "handshake_us", where), 1)
    return out


def cluster(profile, name, description, rendezvous=None):
    m = block_of(profile, "machine")
    nodes, ranks = m.get("nodes"), m.get("ranks")
    if not isinstance(nodes, int) or not isinstance(ranks, int) or nodes < 1 or ranks % nodes:
        die(f"machine.nodes {nodes!r} and machine.ranks {ranks!r}: need positive integers, "
            "ranks a multiple of nodes")
    intra, inter = link(profile, "intra"), link(profile, "inter")
    gemm, memory = block_of(profile, "gemm"), block_of(profile, "memory")
    if not gemm or not memory:
        die("the profile has no gemm or memory block (valid: a profile `parm calibrate` wrote)")
    fused, sync = block_of(profile, "fused"), block_of(profile, "step_sync")
    created = m.get("created_utc", "an unknown time")
    c = {
        "name": name,
        "description": description,
        "nodes": nodes,
        "devices_per_node": ranks // nodes,
        "intra": intra,
        "inter": inter,
        "gemm": {"tflops": float(f"{median_of(gemm, 'gflops', 'gemm') / 1e3:.4g}"),
                 "alpha_us": round(median_of(gemm, "alpha_us", "gemm"), 1)},
        "memory": {"gbps": round(median_of(memory, "gbps", "memory"), 2),
                   "alpha_us": round(median_of(memory, "alpha_us", "memory"), 1)},
        "fused_overlap": number(fused, "overlap", 1.0, "fused"),
        "fused_per_piece_us": number(fused, "per_piece_us", 0.0, "fused"),
        "step_sync_us": number(sync, "us", 0.0, "step_sync"),
        "step_sync_per_compute": (number(sync, "per_compute", 0.0, "step_sync")
                                  if rendezvous is None else rendezvous),
        "notes": [
            f"Made by bench/tools/cluster_from_profile.py from the profile `parm calibrate` "
            f"wrote on this cluster at {created}: per link class the median over the four "
            "collectives' terms (alpha, alpha per rank, beta; inter: the handshake above the "
            "eager limit too), the median over the GEMM classes and over the memory classes; "
            "the fused, eager and rendezvous terms as the profile has them.",
            "inter beta is per byte through one node's link (model.h).",
            f"Profile sources: eager limit {fused.get('eager_limit_source', 'none')}; "
            f"eager gain {fused.get('eager_gain_source', 'none')}; "
            f"mixed {fused.get('eager_gain_mixed_source', 'none')}; "
            f"rendezvous {sync.get('source', 'none')}"
            + ("." if rendezvous is None else f"; per_compute {rendezvous} given by hand."),
        ],
    }
    intra_sync = block_of(profile, "step_sync_intra")
    if intra_sync:  # the steps within a node (issue 42); absent: step_sync's
        c["step_sync_intra_us"] = number(intra_sync, "us", 0.0, "step_sync_intra")
        c["step_sync_intra_per_compute"] = number(intra_sync, "per_compute", 0.0,
                                                  "step_sync_intra")
        cap = number(intra_sync, "compute_cap_us", 0.0, "step_sync_intra")
        if cap > 0:  # 0: no cap, the key left out
            c["step_sync_intra_compute_cap_us"] = cap
    cap = number(sync, "compute_cap_us", 0.0, "step_sync")
    if cap > 0:
        c["step_sync_compute_cap_us"] = cap
    limit = number(fused, "eager_limit_bytes", 0.0, "fused")
    if limit > 0:
        c["fused_eager_gain"] = round(number(fused, "eager_gain", 0.0, "fused"), 3)
        c["fused_eager_gain_mixed"] = round(number(fused, "eager_gain_mixed", 0.0, "fused"), 3)
        c["fused_eager_limit_bytes"] = limit
    return c


def main():
    a = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--profile", required=True)
    a.add_argument("--name", required=True)
    a.add_argument("--description", required=True)
    a.add_argument("--rendezvous-per-compute", type=float)
    a.add_argument("--out")
    args = a.parse_args()
    r = args.rendezvous_per_compute
    if r is not None and not (math.isfinite(r) and r >= 0):
        die(f"--rendezvous-per-compute {r}: need a finite number >= 0")
    try:
        with open(args.profile) as f:
            profile = json.load(f)
    except (OSError, ValueError) as e:
        die(f"--profile {args.profile}: {e}")
    if not isinstance(profile, dict):
        die(f"--profile {args.profile}: not a JSON object")
    text = json.dumps(cluster(profile, args.name, args.description, r), indent=2) + "\n"
    if not args.out:
        sys.stdout.write(text)
        return
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        die(f"--out {args.out}: the folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    except OSError as e:
        die(f"--out {args.out}: {e}")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, args.out)
    except BaseException:
        os.unlink(tmp)
        raise


if __name__ == "__main__":
    main()
