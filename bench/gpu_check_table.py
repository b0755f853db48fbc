#!/usr/bin/env python3
"""The closing table of bench/gpu-check: Parm's MoE layer on the GPU against plain PyTorch.

    python3 bench/gpu_check_table.py RESULTS_DIR [--json-out FILE]

Reads from RESULTS_DIR
  parm-bench-<fp32|bf16>-np<N>.json   `parm bench-layer --json` (config + one result row per
                                      schedule: forward_ms/backward_ms {median, max},
                                      floor_ms, time_over_floor, floor_gflops, ...)
  torch-bench.jsonl                   bench/torch_moe_layer.py's JSON lines
  parm-shape-<i>[-graphs<0|1>].json   the shapes stage: `bench-layer` at the GPU-layer issue's
                                      shapes (1 rank, bf16), CUDA graphs off (0) or on (1)
and prints every schedule of every Parm run, then one row per (precision, rank count):
Parm's fastest schedule (forward + backward, the medians summed as bench-layer does), its
floor (the expert products timed alone on the filled rows) and time / floor, the PyTorch
layer's time on the same total tokens on the one GPU (N ranks x T tokens each) and
PyTorch / Parm (> 1: Parm is faster). A missing or unreadable file gives a row of '-' and
a note, never an exception: the table shows whatever the run produced. Last, one row per
shape of the shapes stage: forward + backward ms, the floor, time / floor, the layer's and the
floor's TFLOP/s (the six expert products over the filled rows, per ms of each), and the
issue's target with how far the run is from it.
"""
import argparse
import glob
import json
import math
import os
import re
import sys


def fmt(v, spec):
    """v formatted by spec, or '-' in the same width when v is missing or not finite."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return format(v, spec)
    width = re.match(r"\d*", spec).group(0)
    return "-".rjust(int(width) if width else 1)


def read_parm(path):
    """(config, rows): rows are dicts name, fwd, bwd, total, floor, tof, gflops."""
    with open(path) as fh:
        doc = json.load(fh)
    rows = []
    for r in doc.get("results", []):
        fwd = r["forward_ms"]["median"]
        bwd = r["backward_ms"]["median"]
        name = r["schedule"] + ("+fused" if r.get("fuse") else "")
        rows.append({"name": name, "fwd": fwd, "bwd": bwd, "total": fwd + bwd,
                     "floor": r.get("floor_ms"), "tof": r.get("time_over_floor"),
                     "gflops": r.get("floor_gflops"), "rows": r.get("floor_rows")})
    return doc.get("config", {}), rows


def load_parm(path, label, notes):
    """read_parm(path), or None with a note (prefixed by label) when the file is unreadable
    or holds no results."""
    try:
        cfg, rows = read_parm(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        notes.append(f"{label}: {os.path.basename(path)} unreadable: {e}")
        return None
    if not rows:
        notes.append(f"{label}: {os.path.basename(path)} holds no results")
        return None
    return cfg, rows


def read_torch(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return out


def build(res_dir):
    """The summary rows and the notes, from the files in res_dir."""
    torch_rows = read_torch(os.path.join(res_dir, "torch-bench.jsonl"))
    notes, details, summary = [], [], []
    for prec in ("fp32", "bf16"):
        files = {}
        for path in glob.glob(os.path.join(res_dir, f"parm-bench-{prec}-np*.json")):
            m = re.search(r"-np(\d+)\.json$", path)
            if m:
                files[int(m.group(1))] = path
        for np_ in sorted(set(files) | {1, 2}):
            row = {"precision": prec, "ranks": np_}
            summary.append(row)
            path = files.get(np_)
            if path is None:
                notes.append(f"{prec} np{np_}: no Parm result (parm-bench-{prec}-np{np_}.json "
                             "missing: that run failed or did not run)")
                continue
            loaded = load_parm(path, f"{prec} np{np_}", notes)
            if loaded is None:
                continue
            cfg, rows = loaded
            world, mp = cfg.get("world", np_), cfg.get("mp", 1)
            tokens = cfg.get("tokens")
            comm = cfg.get("comm_backend") or cfg.get("comm")  # the one used, else the one asked
            row["layout"] = (f"mp{mp} ep{cfg.get('ep', '?')} esp{cfg.get('esp', '?')}"
                             + (f" {comm}" if comm else ""))
            for key, want in (("device", "cuda"), ("precision", prec)):
                if cfg.get(key, want) != want:
                    notes.append(f"{prec} np{np_}: {os.path.basename(path)} says {key} "
                                 f"{cfg[key]}, not {want}")
            details.append((f"{prec}, {world} rank(s), {row['layout']}, T={tokens} per MP "
                            "group", rows))
            best = min(rows, key=lambda r: r["total"])
            row.update({"schedule": best["name"], "parm_ms": best["total"],
                        "floor_ms": best["floor"], "time_over_floor": best["tof"]})
            # The ranks share the one GPU: PyTorch gets all their tokens in one layer.
            total_tokens = tokens * (world // mp) if isinstance(tokens, int) else None
            row["tokens_on_gpu"] = total_tokens
            match = [t for t in torch_rows
                     if t.get("precision") == prec and t.get("tokens") == total_tokens]
            if not match:
                notes.append(f"{prec} np{np_}: no PyTorch result for T={total_tokens}")
                continue
            t = match[-1]
            row.update({"torch_ms": t.get("total_ms"), "torch_floor_ms": t.get("floor_ms")})
            if isinstance(row["torch_ms"], (int, float)) and row["parm_ms"] > 0:
                row["torch_over_parm"] = row["torch_ms"] / row["parm_ms"]
    return summary, details, notes, torch_rows


# The GPU-layer issue's targets, by (T, M, H, E, k): forward + backward ms at most, and the
# floor's TFLOP/s at least (None: no floor target).
SHAPE_TARGETS = {
    (1024, 512, 2048, 8, 2): (0.45, None),
    (8192, 1024, 4096, 16, 2): (1.9, 600.0),
    (8192, 2048, 1024, 64, 8): (4.5, None),
}


def shape_key(cfg):
    try:
        return tuple(int(cfg[k]) for k in ("tokens", "model_dim", "hidden", "experts", "topk"))
    except (KeyError, TypeError, ValueError):
        return None


def build_shapes(res_dir):
    """(rows, notes) of the shapes stage: one row per parm-shape-<i>[-graphs<g>].json, in
    (i, g) order."""
    rows, notes = [], []
    paths = []
    for path in glob.glob(os.path.join(res_dir, "parm-shape-*.json")):
        m = re.search(r"parm-shape-(\d+)(?:-graphs(\d))?\.json$", path)
        if m:
            graphs = None if m.group(2) is None else m.group(2) == "1"
            paths.append((int(m.group(1)), -1 if graphs is None else int(graphs), graphs, path))
    for _, _, graphs, path in sorted(paths):
        name = os.path.basename(path)
        loaded = load_parm(path, "shapes", notes)
        if loaded is None:
            continue
        cfg, results = loaded
        best = min(results, key=lambda r: r["total"])
        key = shape_key(cfg)
        row = {"shape": key, "graphs": graphs, "schedule": best["name"], "ms": best["total"],
               "floor_ms": best["floor"], "time_over_floor": best["tof"],
               "floor_tflops": None, "tflops": None}
        if isinstance(best["gflops"], (int, float)) and isinstance(best["floor"], (int, float)):
            row["floor_tflops"] = best["gflops"] / 1e3
            # The same FLOPs (the six products over the filled rows) per ms of the whole layer.
            if best["total"] > 0:
                row["tflops"] = best["gflops"] * best["floor"] / best["total"] / 1e3
        target = SHAPE_TARGETS.get(key)
        if target is not None:
            row["target_ms"], row["target_floor_tflops"] = target
            row["meets_ms"] = row["ms"] <= target[0]
            row["ms_over_target"] = row["ms"] / target[0]
            if target[1] is not None and row["floor_tflops"] is not None:
                row["meets_floor"] = row["floor_tflops"] >= target[1]
        else:
            notes.append(f"shapes: {name} is shape {key}, which has no target")
        rows.append(row)
    return rows, notes


def render_shapes(rows, notes):
    lines = ["", "# GPU-layer issue shapes: bf16, 1 rank, forward + backward median ms; "
             "TFLOP/s = the six expert products over the filled rows per ms"]
    head = (f"{'T M H E k':<24}{'graphs':<8}{'ms':>8}{'floor ms':>10}{'t/floor':>9}"
            f"{'TFLOP/s':>9}{'floor TF/s':>11}  {'target':<28}")
    lines.append(head)
    lines.append("-" * len(head))
    for r in rows:
        shape = " ".join(str(v) for v in r["shape"]) if r["shape"] else "?"
        if "target_ms" in r:
            verdict = "met" if r["meets_ms"] else "MISSED"
            target = f"<= {r['target_ms']} ms: {verdict} ({r['ms_over_target']:.2f}x)"
            if "meets_floor" in r:
                target += (f"; floor >= {r['target_floor_tflops']:.0f}: "
                           + ("met" if r["meets_floor"] else "MISSED"))
        else:
            target = "-"
        graphs = {None: "-", True: "on", False: "off"}[r["graphs"]]
        lines.append(f"{shape:<24}{graphs:<8}{fmt(r['ms'], '8.3f')}{fmt(r['floor_ms'], '10.3f')}"
                     f"{fmt(r['time_over_floor'], '9.2f')}{fmt(r['tflops'], '9.0f')}"
                     f"{fmt(r['floor_tflops'], '11.0f')}  {target}")
    if not rows:
        lines.append("(no parm-shape-*.json: the shapes stage failed or did not run)")
    for n in notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def render(summary, details, notes, torch_rows):
    lines = []
    for title, rows in details:
        lines.append(f"# parm bench-layer: {title}")
        lines.append(f"  {'schedule':<16}{'fwd ms':>10}{'bwd ms':>10}{'total ms':>10}"
                     f"{'floor ms':>10}{'t/floor':>9}{'GFLOP/s':>10}")
        for r in rows:
            lines.append(f"  {r['name']:<16}{fmt(r['fwd'], '10.3f')}{fmt(r['bwd'], '10.3f')}"
                         f"{fmt(r['total'], '10.3f')}{fmt(r['floor'], '10.3f')}"
                         f"{fmt(r['tof'], '9.2f')}{fmt(r['gflops'], '10.0f')}")
    if torch_rows:
        lines.append("# PyTorch (bench/torch_moe_layer.py): padded (E, C, M) dispatch, baddbmm "
                     "experts; floor = the six bmm products alone on the padded rows")
        lines.append(f"  {'precision':<10}{'T':>6}{'C':>6}{'fwd ms':>10}{'bwd ms':>10}"
                     f"{'total ms':>10}{'floor ms':>10}{'t/floor':>9}{'GFLOP/s':>10}")
        for t in torch_rows:
            lines.append(f"  {t.get('precision', '?'):<10}{t.get('tokens', 0):>6}"
                         f"{t.get('capacity', 0):>6}{fmt(t.get('forward_ms'), '10.3f')}"
                         f"{fmt(t.get('backward_ms'), '10.3f')}{fmt(t.get('total_ms'), '10.3f')}"
                         f"{fmt(t.get('floor_ms'), '10.3f')}{fmt(t.get('time_over_floor'), '9.2f')}"
                         f"{fmt(t.get('floor_gflops'), '10.0f')}")
    lines.append("")
    lines.append("# MoE layer forward + backward, median ms (Parm: fastest schedule; PyTorch on "
                 "the same tokens, all ranks' together)")
    head = (f"{'precision':<10}{'ranks':>6}  {'layout':<19}{'schedule':<15}{'parm ms':>9}"
            f"{'floor ms':>10}{'t/floor':>9}{'T on GPU':>10}{'torch ms':>10}{'torch/parm':>12}")
    lines.append(head)
    lines.append("-" * len(head))
    for r in summary:
        lines.append(f"{r['precision']:<10}{r['ranks']:>6}  {r.get('layout', '-'):<19}"
                     f"{r.get('schedule', '-'):<15}{fmt(r.get('parm_ms'), '9.3f')}"
                     f"{fmt(r.get('floor_ms'), '10.3f')}{fmt(r.get('time_over_floor'), '9.2f')}"
                     f"{fmt(r.get('tokens_on_gpu'), '10d')}{fmt(r.get('torch_ms'), '10.3f')}"
                     f"{fmt(r.get('torch_over_parm'), '12.2f')}")
    lines.append("torch/parm > 1: Parm is faster. floor: Parm's expert products over the filled "
                 "rows timed alone (cuBLAS).")
    for n in notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir")
    ap.add_argument("--json-out", help="also write the summary rows and notes as JSON")
    args = ap.parse_args()
    summary, details, notes, torch_rows = build(args.results_dir)
    shape_rows, shape_notes = build_shapes(args.results_dir)
    print(render(summary, details, notes, torch_rows))
    print(render_shapes(shape_rows, shape_notes))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"summary": summary, "notes": notes, "shapes": shape_rows,
                       "shape_notes": shape_notes}, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
