#!/usr/bin/env python3
"""The MoE layer of docs/spec.md §2 in plain PyTorch, written the way a typical implementation writes
it, to time against `parm bench-layer` on the same GPU (bench/gpu-check runs both).

The layer (x: (T, M) -> out: (T, M), l_aux):
  gate      logits = x Wg (no bias), p = softmax(logits), fp32
  top-k     torch.topk(p, k); combine weights renormalised over the k chosen when k > 1
            (before any drop)
  capacity  C = ceil(k * f * T / E) in integers, f taken as the exact decimal it was written as
  slots     GShard order: all 1st choices in token order, then all 2nd choices, ... (a cumsum
            over the choice-major one-hot); a choice past C is dropped
  dispatch  a padded buffer (E, C, M), unused slots zero (index_copy)
  experts   y = gelu_tanh(x W1_e + b1_e) W2_e + b2_e for all E at once as batched products
            (torch.baddbmm over (E, C, M) x (E, M, H) and (E, C, H) x (E, H, M)): every one of
            the E*C slots is computed, filled or not, as padded implementations do (Parm
            computes only the filled rows)
  combine   out_t = sum over kept choices of w * y (index_add)
  l_aux     E * sum_e frac_e * meanp_e, frac_e = share of tokens whose 1st choice is e
The backward pass is autograd's, for out.backward(dout) plus l_aux.backward(dl_aux)
(dl_aux = 0.01, the value `parm bench-layer` uses).

Precisions:
  fp32  everything fp32 and TF32 off (torch.backends.cuda.matmul.allow_tf32 = False and
        matmul precision "highest"), so fp32 products are true fp32 as cuBLAS runs them in Parm.
  bf16  torch.autocast(device_type, dtype=torch.bfloat16) around the expert products only:
        bf16 operands (the fp32 master weights cast each pass, as autocast does), fp32
        accumulation inside cuBLAS, and autocast's bf16 outputs, so the hidden activations and
        the GeLU are bf16 (Parm keeps fp32 outputs). Gate, softmax, routing, combine, l_aux and
        every parameter and gradient stay fp32.

Timing: --warmup untimed passes, then --iters timed ones; per pass the forward and the
backward are timed with torch.cuda.Event (time.perf_counter on the CPU), with a device sync
after each pass; medians are reported. The "floor" is the six expert products of one
forward + backward pass (2 forward, 4 backward) on the padded (E, C, *) shapes, timed alone
with torch.bmm in the same precision, as `parm bench-layer` times its own products alone.

Output: one JSON line per (precision, tokens) on stdout (also appended to --json FILE);
progress on stderr.

Checks (exit 1 on a mismatch, 0 when all pass):
  --check          the torch layer (fp64, on --device) against a slow plain-loop version of
                   the same maths with a hand-written backward (the adjoints of
                   src/moe/reference_moe.cpp), on tiny shapes with drops, k = 1, 2, 3;
                   outputs and every gradient.
  --parm-dump DIR  the torch layer (fp64 and fp32, on --device) against Parm's fp64 oracle
                   from `parm check-layer --dump DIR` on one rank: same weights and inputs,
                   outputs, l_aux and every gradient.

  python3 bench/torch_moe_layer.py --device cuda --precision fp32,bf16 --tokens 1024,2048
  python3 bench/torch_moe_layer.py --device cpu --check
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# capacity (docs/spec.md §2 item 3) and the dump's .npy files, as the tests read them.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
from parm_testlib import capacity, read_npy_raw  # noqa: E402

DL_AUX = 0.01  # what `parm bench-layer` passes as the gradient of l_aux


def log(msg):
    print(f"torch_moe_layer: {msg}", file=sys.stderr, flush=True)


# ---- parameters -------------------------------------------------------------------------------

def init_params(M, H, E, device, dtype, gen):
    """Parm's initial scales (reference_moe.h), fresh draws: wg, w1 ~ N(0, 1/M),
    w2 ~ N(0, 1/H), b1, b2 ~ N(0, 0.1^2). Leaves with requires_grad."""
    def normal(shape, std):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64) * std
        return t.to(device=device, dtype=dtype).requires_grad_(True)
    return {
        "wg": normal((M, E), 1 / math.sqrt(M)),     # (M, E)
        "w1": normal((E, M, H), 1 / math.sqrt(M)),  # (E, M, H)
        "b1": normal((E, H), 0.1),                  # (E, H)
        "w2": normal((E, H, M), 1 / math.sqrt(H)),  # (E, H, M)
        "b2": normal((E, M), 0.1),                  # (E, M)
    }


PARAM_NAMES = ("wg", "w1", "b1", "w2", "b2")


# ---- the layer, as a typical PyTorch implementation writes it -------------------------------

def moe_forward(x, p, k, C, bf16=False):
    """x (T, M); p the parameters; C the capacity. Returns out (T, M), l_aux (scalar) and the
    number of kept choices (a 0-dim tensor, not synchronised)."""
    T, M = x.shape
    E = p["wg"].shape[1]
    logits = x @ p["wg"]                                    # (T, E)
    probs = torch.softmax(logits, dim=-1)                   # (T, E)
    top_p, top_e = torch.topk(probs, k, dim=-1)             # (T, k), sorted, largest first
    w = top_p / top_p.sum(dim=-1, keepdim=True) if k > 1 else top_p  # (T, k)

    # GShard slots: choices in priority order (all 1st choices in token order, then 2nd...).
    e_flat = top_e.t().reshape(-1)                          # (k*T)
    onehot = F.one_hot(e_flat, E)                           # (k*T, E)
    slot = (torch.cumsum(onehot, dim=0) - 1).gather(1, e_flat[:, None]).squeeze(1)  # (k*T)
    kept = slot < C                                         # (k*T)
    tok = torch.arange(T, device=x.device).repeat(k)        # (k*T) token of each choice
    row = (e_flat * C + slot)[kept]                         # (kept) row of the (E*C) buffer
    tok_kept = tok[kept]                                    # (kept)
    w_kept = w.t().reshape(-1)[kept]                        # (kept)

    disp = x.new_zeros(E * C, M).index_copy(0, row, x[tok_kept]).view(E, C, M)  # (E, C, M)
    ctx = (torch.autocast(device_type=x.device.type, dtype=torch.bfloat16) if bf16
           else contextlib.nullcontext())
    with ctx:
        h = torch.baddbmm(p["b1"].unsqueeze(1), disp, p["w1"])  # (E, C, H)
        a = F.gelu(h, approximate="tanh")                       # (E, C, H)
        y = torch.baddbmm(p["b2"].unsqueeze(1), a, p["w2"])     # (E, C, M)
    y = y.to(x.dtype).reshape(E * C, M)
    out = x.new_zeros(T, M).index_add(0, tok_kept, y[row] * w_kept[:, None])  # (T, M)

    frac = F.one_hot(top_e[:, 0], E).to(x.dtype).mean(dim=0)  # (E) 1st choices, before drops
    l_aux = E * (frac * probs.mean(dim=0)).sum()
    return out, l_aux, kept.sum()


# ---- the slow plain-loop version (fp64 Python floats), with its hand-written backward ----------

_C0 = 0.79788456080286535588  # sqrt(2/pi)
_A = 0.044715


def _gelu(v):
    return 0.5 * v * (1.0 + math.tanh(_C0 * (v + _A * v ** 3)))


def _gelu_grad(v):
    th = math.tanh(_C0 * (v + _A * v ** 3))
    return 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * _C0 * (1.0 + 3.0 * _A * v * v)


def loop_layer(x, p, dout, k, C, dl_aux):
    """docs/spec.md §2 with plain loops over nested lists: forward, then the exact adjoint of every
    step. x, dout: T lists of M; p: nested lists. Returns (out, l_aux, grads, num_dropped)."""
    T, M = len(x), len(x[0])
    E, H = len(p["wg"][0]), len(p["b1"][0])
    wg, w1, b1, w2, b2 = (p[n] for n in PARAM_NAMES)
    # 1. gate
    probs = []
    for t in range(T):
        lg = [sum(x[t][m] * wg[m][e] for m in range(M)) for e in range(E)]
        mx = max(lg)
        ex = [math.exp(v - mx) for v in lg]
        s = sum(ex)
        probs.append([v / s for v in ex])
    # 2. top-k (ties to the lower index: strict '>' scanning upward), weights
    choice, prob, weight = [], [], []
    for t in range(T):
        taken, ch = set(), []
        for _ in range(k):
            best = -1
            for e in range(E):
                if e not in taken and (best < 0 or probs[t][e] > probs[t][best]):
                    best = e
            taken.add(best)
            ch.append(best)
        pr = [probs[t][e] for e in ch]
        z = sum(pr)
        choice.append(ch)
        prob.append(pr)
        weight.append([v / z for v in pr] if k > 1 else pr[:])
    # 3. slots, GShard order
    fill = [0] * E
    slot = [[-1] * k for _ in range(T)]
    for j in range(k):
        for t in range(T):
            e = choice[t][j]
            if fill[e] < C:
                slot[t][j] = fill[e]
                fill[e] += 1
    # 4-5. experts on the filled slots only (an unused slot gets no gradient anyway)
    pre, act, y = {}, {}, {}
    for t in range(T):
        for j in range(k):
            if slot[t][j] < 0:
                continue
            e = choice[t][j]
            hp = [b1[e][h] + sum(x[t][m] * w1[e][m][h] for m in range(M)) for h in range(H)]
            ha = [_gelu(v) for v in hp]
            pre[t, j], act[t, j] = hp, ha
            y[t, j] = [b2[e][m] + sum(ha[h] * w2[e][h][m] for h in range(H)) for m in range(M)]
    # 6. combine
    out = [[0.0] * M for _ in range(T)]
    for (t, j), yv in y.items():
        for m in range(M):
            out[t][m] += weight[t][j] * yv[m]
    # 7. l_aux
    count = [0.0] * E
    for t in range(T):
        count[choice[t][0]] += 1.0
    psum = [sum(probs[t][e] for t in range(T)) for e in range(E)]
    l_aux = E * sum((count[e] / T) * (psum[e] / T) for e in range(E))

    # backward
    g = {n: _zeros_like(p[n]) for n in PARAM_NAMES}
    dx = [[0.0] * M for _ in range(T)]
    dweight = [[0.0] * k for _ in range(T)]
    for (t, j), yv in y.items():
        e = choice[t][j]
        dweight[t][j] = sum(dout[t][m] * yv[m] for m in range(M))
        dy = [weight[t][j] * dout[t][m] for m in range(M)]
        for m in range(M):
            g["b2"][e][m] += dy[m]
        dpre = []
        for h in range(H):
            dact = 0.0
            for m in range(M):
                g["w2"][e][h][m] += act[t, j][h] * dy[m]
                dact += dy[m] * w2[e][h][m]
            dpre.append(dact * _gelu_grad(pre[t, j][h]))
        for h in range(H):
            g["b1"][e][h] += dpre[h]
        for m in range(M):
            for h in range(H):
                g["w1"][e][m][h] += x[t][m] * dpre[h]
            dx[t][m] += sum(dpre[h] * w1[e][m][h] for h in range(H))
    dprobs = [[0.0] * E for _ in range(T)]
    for t in range(T):
        if k == 1:
            dprobs[t][choice[t][0]] += dweight[t][0]
        else:
            z = sum(prob[t])
            dot = sum(dweight[t][j] * weight[t][j] for j in range(k))
            for j in range(k):
                dprobs[t][choice[t][j]] += (dweight[t][j] - dot) / z
        for e in range(E):
            dprobs[t][e] += dl_aux * E * (count[e] / T) / T
    for t in range(T):
        dot = sum(dprobs[t][e] * probs[t][e] for e in range(E))
        dlg = [probs[t][e] * (dprobs[t][e] - dot) for e in range(E)]
        for m in range(M):
            for e in range(E):
                g["wg"][m][e] += x[t][m] * dlg[e]
            dx[t][m] += sum(dlg[e] * wg[m][e] for e in range(E))
    dropped = sum(1 for t in range(T) for j in range(k) if slot[t][j] < 0)
    return out, l_aux, dict(g, x=dx), dropped


def _zeros_like(v):
    return [_zeros_like(u) for u in v] if isinstance(v, list) else 0.0


# ---- comparisons ------------------------------------------------------------------------------

def rel_error(got, want):
    """max|got - want| / max|want| (max|got - want| when want is all zero); NaN -> inf."""
    got = torch.as_tensor(got, dtype=torch.float64).cpu()
    want = torch.as_tensor(want, dtype=torch.float64).cpu()
    if got.shape != want.shape:
        raise ValueError(f"shape {tuple(got.shape)} against {tuple(want.shape)}")
    err = (got - want).abs().max().item() if got.numel() else 0.0
    if math.isnan(err):
        return math.inf
    ref = want.abs().max().item() if want.numel() else 0.0
    return err / ref if ref > 0 else err


def torch_layer_grads(x, params, dout, k, C, dl_aux, bf16=False):
    """Runs the torch layer forward and backward; returns out, l_aux, grads by name
    (x and the parameters), the number of kept choices."""
    x = x.detach().clone().requires_grad_(True)
    p = {n: params[n].detach().clone().requires_grad_(True) for n in PARAM_NAMES}
    out, l_aux, kept = moe_forward(x, p, k, C, bf16)
    torch.autograd.backward([out, l_aux], [dout, torch.tensor(dl_aux, dtype=l_aux.dtype,
                                                              device=l_aux.device)])
    grads = {n: p[n].grad for n in PARAM_NAMES}
    grads["x"] = x.grad
    return out.detach(), l_aux.item(), grads, int(kept.item())


def report(name, errs, tol):
    ok = all(e <= tol for e in errs.values())
    worst = max(errs, key=errs.get)
    log(f"{name}: {'PASS' if ok else 'FAIL'} (tolerance {tol:.0e} on max|error| / max|reference|; "
        f"worst {worst} {errs[worst]:.2e}) "
        + " ".join(f"{n}={e:.1e}" for n, e in errs.items()))
    return ok


def self_check(device):
    """The torch layer in fp64 against loop_layer on tiny shapes (drops; k = 1, 2, 3)."""
    ok = True
    assert capacity(1, "1.1", 3000, 4) == 825, capacity(1, "1.1", 3000, 4)
    assert capacity(2, "1.2", 1024, 8) == 308, capacity(2, "1.2", 1024, 8)
    cases = [  # T, M, H, E, k, f, seed
        (16, 6, 10, 4, 2, "1.0", 1),
        (12, 5, 7, 3, 1, "0.5", 2),
        (10, 4, 6, 4, 3, "1.25", 3),
        (20, 8, 12, 8, 2, "1.2", 4),
    ]
    total_dropped = 0
    for T, M, H, E, k, f, seed in cases:
        gen = torch.Generator().manual_seed(seed)
        params = init_params(M, H, E, "cpu", torch.float64, gen)
        x = torch.randn(T, M, generator=gen, dtype=torch.float64)
        dout = torch.randn(T, M, generator=gen, dtype=torch.float64)
        C = capacity(k, f, T, E)
        out_l, laux_l, grads_l, dropped = loop_layer(
            x.tolist(), {n: params[n].detach().tolist() for n in PARAM_NAMES}, dout.tolist(), k, C,
            0.5)
        total_dropped += dropped
        dev = {n: params[n].detach().to(device) for n in PARAM_NAMES}
        out_t, laux_t, grads_t, kept = torch_layer_grads(x.to(device), dev, dout.to(device), k, C, 0.5)
        errs = {"out": rel_error(out_t, out_l),
                "l_aux": abs(laux_t - laux_l) / max(1.0, abs(laux_l)),
                "kept": float(kept != T * k - dropped)}
        errs.update({"d" + n: rel_error(grads_t[n], grads_l[n]) for n in ("x",) + PARAM_NAMES})
        ok = report(f"--check T={T} M={M} H={H} E={E} k={k} f={f} C={C} ({dropped} of {T * k} "
                    f"choices dropped), fp64 on {device}", errs, 1e-10) and ok
    if total_dropped == 0:
        log("--check: FAIL: no case dropped a choice, so drops went untested")
        ok = False
    return ok


# ---- Parm's dump (parm check-layer --dump DIR) --------------------------------------------------

def read_npy(path):
    """A little-endian float32/float64 C-order .npy file as a float64 CPU tensor."""
    shape, descr, body = read_npy_raw(path)
    dtypes = {"<f4": torch.float32, "<f8": torch.float64}
    if descr not in dtypes:
        raise ValueError(f"{path}: unsupported .npy type {descr} (float32 or float64 only)")
    body = bytearray(body)
    t = torch.frombuffer(body, dtype=dtypes[descr]) if body else torch.zeros(0)
    return t.to(torch.float64).reshape(shape)


def parm_dump_check(dump_dir, device):
    """The torch layer against Parm's fp64 oracle on the dump's weights and inputs."""
    with open(os.path.join(dump_dir, "manifest.json")) as fh:
        cfg = json.load(fh)["config"]
    if cfg.get("world", 1) != 1:
        log(f"--parm-dump {dump_dir}: FAIL: the dump is from {cfg['world']} ranks; use one "
            "written by `parm check-layer --dump DIR` on one rank (its oracle gradients are "
            "summed over MP groups)")
        return False
    T, M, H, E, k = (cfg[n] for n in ("tokens", "model_dim", "hidden", "experts", "topk"))
    f = cfg["capacity_factor"]
    C = capacity(k, f, T, E)
    dl_aux = float(cfg["dl_aux"])

    def load(name):
        return read_npy(os.path.join(dump_dir, name))
    x, dout = load("input.x.npy"), load("input.dout.npy")
    params = {n: load(f"param.{n}.npy") for n in PARAM_NAMES}
    want = {"out": load("oracle.out.npy"), "l_aux": load("oracle.l_aux.npy").item(),
            "dx": load("oracle.dx.npy")}
    want.update({"d" + n: load(f"oracle.d{n}.npy") for n in PARAM_NAMES})
    ok = True
    for dtype, tol in ((torch.float64, 1e-9), (torch.float32, 2e-4)):
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
        dev = {n: v.to(device=device, dtype=dtype) for n, v in params.items()}
        out, laux, grads, kept = torch_layer_grads(x.to(device=device, dtype=dtype), dev,
                                                   dout.to(device=device, dtype=dtype), k, C,
                                                   dl_aux)
        errs = {"out": rel_error(out, want["out"]),
                "l_aux": abs(laux - want["l_aux"]) / max(1.0, abs(want["l_aux"]))}
        errs.update({"d" + n: rel_error(grads[n], want["d" + n]) for n in ("x",) + PARAM_NAMES})
        name = str(dtype).replace("torch.", "")
        ok = report(f"--parm-dump T={T} M={M} H={H} E={E} k={k} f={f} C={C} ({T * k - kept} "
                    f"choices dropped): torch {name} on {device} against Parm's fp64 oracle",
                    errs, tol) and ok
    return ok


# ---- timing -----------------------------------------------------------------------------------

class Clock:
    """Marks on the device's stream (torch.cuda.Event) or host times (CPU)."""

    def __init__(self, device):
        self.cuda = device == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, a, b):  # call after sync()
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


def time_products(E, C, M, H, dtype, device, iters, warmup, clock, reps=5):
    """The six expert products of one forward + backward pass on the padded shapes, alone:
    returns the median over iterations of the ms per pass (each iteration runs `reps`
    passes)."""
    g = torch.Generator(device=device).manual_seed(7)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    xin, w1, w2 = rnd(E, C, M), rnd(E, M, H), rnd(E, H, M)
    act, dy, dh = rnd(E, C, H), rnd(E, C, M), rnd(E, C, H)
    o_ch, o_cm = torch.empty(E, C, H, device=device, dtype=dtype), torch.empty(E, C, M, device=device, dtype=dtype)
    o_mh, o_hm = torch.empty(E, M, H, device=device, dtype=dtype), torch.empty(E, H, M, device=device, dtype=dtype)
    times = []
    for it in range(warmup + iters):
        a = clock.mark()
        for _ in range(reps):  # back to back, so the launch latency of the first is spread
            torch.bmm(xin, w1, out=o_ch)                  # forward: h = x W1
            torch.bmm(act, w2, out=o_cm)                  # forward: y = a W2
            torch.bmm(dy, w2.transpose(1, 2), out=o_ch)   # backward: da = dy W2^T
            torch.bmm(act.transpose(1, 2), dy, out=o_hm)  # backward: dW2 = a^T dy
            torch.bmm(dh, w1.transpose(1, 2), out=o_cm)   # backward: dx = dh W1^T
            torch.bmm(xin.transpose(1, 2), dh, out=o_mh)  # backward: dW1 = x^T dh
        b = clock.mark()
        clock.sync()
        if it >= warmup:
            times.append(clock.ms(a, b) / reps)
    return statistics.median(times)


def bf16_reduced_precision_reduction():
    """torch's setting for cuBLAS bf16 split-K reductions (None where torch has none; torch
    1.13 raises AssertionError, not AttributeError, for an unknown name)."""
    try:
        return bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
    except (AttributeError, AssertionError):
        return None


def bench_one(args, precision, T, device):
    M, H, E, k = args.model_dim, args.hidden, args.experts, args.topk
    C = capacity(k, args.capacity_factor, T, E)
    bf16 = precision == "bf16"
    gen = torch.Generator().manual_seed(args.seed)
    p = init_params(M, H, E, device, torch.float32, gen)
    x = torch.randn(T, M, generator=gen).to(device).requires_grad_(True)
    dout = torch.randn(T, M, generator=gen).to(device)
    dl_aux = torch.tensor(DL_AUX, device=device)
    clock = Clock(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    fwd, bwd, tot = [], [], []
    kept = 0
    for it in range(args.warmup + args.iters):
        for v in list(p.values()) + [x]:
            v.grad = None
        t0 = clock.mark()
        out, l_aux, kept_t = moe_forward(x, p, k, C, bf16)
        t1 = clock.mark()
        torch.autograd.backward([out, l_aux], [dout, dl_aux])
        t2 = clock.mark()
        clock.sync()
        kept = int(kept_t.item())
        if it >= args.warmup:
            fwd.append(clock.ms(t0, t1))
            bwd.append(clock.ms(t1, t2))
            tot.append(clock.ms(t0, t2))
    peak_mib = torch.cuda.max_memory_allocated() / 2 ** 20 if device == "cuda" else None
    prod_dtype = torch.bfloat16 if bf16 else torch.float32
    floor_ms = time_products(E, C, M, H, prod_dtype, device, args.iters, args.warmup, clock)
    floor_flops = 6 * 2 * E * C * M * H
    total_ms = statistics.median(tot)
    return {
        "impl": "torch",
        "torch_version": torch.__version__,
        "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "precision": precision,
        "bf16_mode": ("torch.autocast(bfloat16) around the expert products: bf16 operands "
                      "and outputs, fp32 master weights, gate and combine") if bf16 else None,
        "tf32": False,
        "bf16_reduced_precision_reduction": bf16_reduced_precision_reduction(),
        "tokens": T, "model_dim": M, "hidden": H, "experts": E, "topk": k,
        "capacity_factor": args.capacity_factor, "capacity": C,
        "kept_choices": kept, "dropped_choices": T * k - kept,
        "padded_rows": E * C,
        "iters": args.iters, "warmup": args.warmup, "dl_aux": DL_AUX,
        "forward_ms": statistics.median(fwd),
        "backward_ms": statistics.median(bwd),
        "total_ms": total_ms,
        "total_ms_min": min(tot),
        "floor_ms": floor_ms,
        "floor_gflops": floor_flops / floor_ms * 1e-6,
        "floor_rows": E * C,
        "time_over_floor": total_ms / floor_ms,
        "peak_allocated_mib": peak_mib,
    }


def parse_list(text, conv):
    return [conv(v) for v in text.split(",") if v]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--precision", default="fp32", help="fp32, bf16, or a list: fp32,bf16")
    ap.add_argument("--tokens", default="1024", help="T, or a list: 1024,2048")
    ap.add_argument("--model-dim", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--capacity-factor", default="1.2", help="an exact decimal")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--json", help="also append the JSON lines to this file")
    ap.add_argument("--check", action="store_true",
                    help="compare with the plain-loop version (fp64, tiny shapes) and exit")
    ap.add_argument("--parm-dump", metavar="DIR",
                    help="compare with Parm's oracle in a one-rank `parm check-layer --dump DIR` "
                         "and exit")
    args = ap.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        log("--device cuda: torch sees no CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # fp32 means fp32: no TF32 in the products (cuBLAS in Parm runs true fp32).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    if args.check or args.parm_dump:
        ok = True
        if args.check:
            ok = self_check(args.device) and ok
        if args.parm_dump:
            ok = parm_dump_check(args.parm_dump, args.device) and ok
        log("checks " + ("passed" if ok else "FAILED"))
        return 0 if ok else 1

    precisions = parse_list(args.precision, str)
    for prec in precisions:
        if prec not in ("fp32", "bf16"):
            ap.error(f"--precision {prec}: use fp32, bf16 or a list of them")
    for T in parse_list(args.tokens, int):
        for prec in precisions:
            log(f"timing {prec} T={T} M={args.model_dim} H={args.hidden} E={args.experts} "
                f"k={args.topk} f={args.capacity_factor} on {args.device}: {args.iters} iters "
                f"+ {args.warmup} warmup")
            r = bench_one(args, prec, T, args.device)
            line = json.dumps(r)
            print(line, flush=True)
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(line + "\n")
            log(f"  {prec} T={T}: forward {r['forward_ms']:.3f} ms, backward "
                f"{r['backward_ms']:.3f} ms, total {r['total_ms']:.3f} ms; floor "
                f"{r['floor_ms']:.3f} ms ({r['floor_gflops']:.0f} GFLOP/s over {r['floor_rows']} "
                f"padded rows); time / floor {r['time_over_floor']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
