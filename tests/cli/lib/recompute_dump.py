#!/usr/bin/env python3
"""Recomputes a `parm check-layer --dump DIR` independently and checks it.

From the dump alone (manifest.json, the parameters and the inputs of every MP group) this
script redoes the MoE layer of docs/spec.md §2 (§8's swiglu experts, §9's shared experts and
gate) in plain Python floats (fp64), without Parm's code and
without numpy, and checks for every source listed under "sources" in the manifest (the
oracle, oracle_sliced, each schedule):
  routing   <source>.expert / .slot / .kept of MP group 0 equal the recomputed routing
            exactly (top-k with ties to the lower expert index, GShard slot order, capacity
            per gate call: S1 and oracle_sliced gate each MP slice separately)
  output    <source>.out of MP group 0
  gradients <source>.dw1 / .db1 / .dw2 / .db2 (swiglu experts: .dw1 / .dw2 / .dw3), with
            shared experts (docs/spec.md §9) also .dsw1 ... (the same kind's) and with the
            shared gate .dswg, summed over every MP group
as max |dump - recomputed| / max |recomputed| <= tolerance (1e-9 for the fp64 oracles, the
run's tolerance for the schedules).

  python3 tests/cli/lib/recompute_dump.py DIR [--expect-ties]

--expect-ties also requires tokens whose routing the tie rule decided (two of a token's
k + 1 largest probabilities bitwise equal), as `check-layer --force-ties` makes.
Prints one line per check; exit status 0 when every check passes, 1 otherwise.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib"))
from parm_testlib import capacity, read_npy  # noqa: E402

ORACLE_TOLERANCE = 1e-9


def gelu(x):
    u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    return 0.5 * x * (1.0 + math.tanh(u))


def silu(x):
    return x / (1.0 + math.exp(-x))


def silu_grad(x):
    s = 1.0 / (1.0 + math.exp(-x))
    return s * (1.0 + x * (1.0 - s))


def expert_params(cfg):
    """The whole parameters of the manifest's experts kind (docs/spec.md §8), then the shared
    experts' (§9: the same kind, "s" before each name) and the shared gate's."""
    names = ("w1", "w2", "w3") if cfg.get("expert_mlp", "gelu") == "swiglu" else \
        ("w1", "b1", "w2", "b2")
    if cfg.get("shared_experts", 0) > 0:
        names += tuple("s" + n for n in names)
        if cfg.get("shared_gate", False):
            names += ("swg",)
    return names


def gelu_grad(x):
    c = math.sqrt(2.0 / math.pi)
    th = math.tanh(c * (x + 0.044715 * x ** 3))
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3 * 0.044715 * x * x)


class Layer:
    def __init__(self, cfg, params):
        self.T, self.M, self.H = cfg["tokens"], cfg["model_dim"], cfg["hidden"]
        self.E, self.k, self.f = cfg["experts"], cfg["topk"], cfg["capacity_factor"]
        self.swiglu = cfg.get("expert_mlp", "gelu") == "swiglu"
        self.shared, self.Hs = cfg.get("shared_experts", 0), cfg.get("shared_hidden", 0)
        self.shared_gate = bool(cfg.get("shared_gate", False))
        self.p = params

    def probs(self, x):
        """softmax(x wg) per token: (T) lists of E."""
        M, E, wg = self.M, self.E, self.p["wg"]
        out = []
        for t in range(self.T):
            row = x[t * M:(t + 1) * M]
            logits = [sum(row[m] * wg[m * E + e] for m in range(M)) for e in range(E)]
            mx = max(logits)
            ex = [math.exp(v - mx) for v in logits]
            s = sum(ex)
            out.append([v / s for v in ex])
        return out

    def route(self, probs, slices):
        """expert, slot (-1 dropped), weight: (T) lists of k; ties to the lower index."""
        T, E, k = self.T, self.E, self.k
        expert = [sorted(range(E), key=lambda e: (-p[e], e))[:k] for p in probs]
        weight = []
        for t in range(T):
            chosen = [probs[t][e] for e in expert[t]]
            weight.append([v / sum(chosen) for v in chosen] if k > 1 else chosen)
        slot = [[-1] * k for _ in range(T)]
        ts = T // slices
        cap = capacity(k, self.f, ts, E)
        for s in range(slices):
            fill = [0] * E
            for j in range(k):
                for t in range(s * ts, (s + 1) * ts):
                    e = expert[t][j]
                    if fill[e] < cap:
                        slot[t][j] = fill[e]
                        fill[e] += 1
        return expert, slot, weight

    def ffn(self, xt, pf, e, H):
        """FFN e of the routed (pf "") or shared (pf "s") experts, width H, on one token:
        pre, gate (swiglu), act, y (docs/spec.md §2 item 5 or §8)."""
        M, p, sw = self.M, self.p, self.swiglu
        w1, w2 = e * M * H, e * H * M
        pre = [(0.0 if sw else p[pf + "b1"][e * H + h]) +
               sum(xt[m] * p[pf + "w1"][w1 + m * H + h] for m in range(M)) for h in range(H)]
        gate = None
        if sw:  # act = silu(x W1) * (x W3), no biases
            gate = [sum(xt[m] * p[pf + "w3"][w1 + m * H + h] for m in range(M)) for h in range(H)]
            act = [silu(pre[h]) * gate[h] for h in range(H)]
        else:
            act = [gelu(v) for v in pre]
        y = [(0.0 if sw else p[pf + "b2"][e * M + m]) +
             sum(act[h] * p[pf + "w2"][w2 + h * M + m] for h in range(H)) for m in range(M)]
        return pre, gate, act, y

    def ffn_backward(self, xt, dy, pf, e, H, fwd, grads):
        """Adds FFN e's weight gradients for output gradient dy (one token) to grads; returns
        nothing (the input gradient is not checked per FFN)."""
        M, p, sw = self.M, self.p, self.swiglu
        pre, gate, act, _ = fwd
        w1, w2 = e * M * H, e * H * M
        if not sw:
            for m in range(M):
                grads[pf + "b2"][e * M + m] += dy[m]
        for h in range(H):
            for m in range(M):
                grads[pf + "w2"][w2 + h * M + m] += act[h] * dy[m]
        dact = [sum(dy[m] * p[pf + "w2"][w2 + h * M + m] for m in range(M)) for h in range(H)]
        if sw:
            dpre = [dact[h] * gate[h] * silu_grad(pre[h]) for h in range(H)]
            dgate = [dact[h] * silu(pre[h]) for h in range(H)]
        else:
            dpre = [gelu_grad(pre[h]) * dact[h] for h in range(H)]
        for h in range(H):
            if not sw:
                grads[pf + "b1"][e * H + h] += dpre[h]
            for m in range(M):
                grads[pf + "w1"][w1 + m * H + h] += xt[m] * dpre[h]
                if sw:
                    grads[pf + "w3"][w1 + m * H + h] += xt[m] * dgate[h]

    def run(self, x, dout, slices, grads):
        """Routing and output of one MP group; adds its expert (and shared expert) gradients
        to grads."""
        M, H, k = self.M, self.H, self.k
        probs = self.probs(x)
        expert, slot, weight = self.route(probs, slices)
        out = [0.0] * (self.T * M)
        for t in range(self.T):
            xt = x[t * M:(t + 1) * M]
            dt = dout[t * M:(t + 1) * M]
            for j in range(k):
                if slot[t][j] < 0:
                    continue
                e, w = expert[t][j], weight[t][j]
                fwd = self.ffn(xt, "", e, H)
                for m in range(M):
                    out[t * M + m] += w * fwd[3][m]
                self.ffn_backward(xt, [w * v for v in dt], "", e, H, fwd, grads)
            if self.shared:  # docs/spec.md §9: out_t += g_t P_t, P_t = sum_s FFN_s(x_t)
                fwds = [self.ffn(xt, "s", s, self.Hs) for s in range(self.shared)]
                P = [sum(f[3][m] for f in fwds) for m in range(M)]
                g = 1.0
                if self.shared_gate:
                    z = sum(xt[m] * self.p["swg"][m] for m in range(M))
                    g = 1.0 / (1.0 + math.exp(-z))
                    dz = sum(dt[m] * P[m] for m in range(M)) * g * (1.0 - g)
                    for m in range(M):
                        grads["swg"][m] += dz * xt[m]
                for m in range(M):
                    out[t * M + m] += g * P[m]
                for s, f in enumerate(fwds):
                    self.ffn_backward(xt, [g * v for v in dt], "s", s, self.Hs, f, grads)
        return probs, expert, slot, out


def tie_decided(probs, k):
    """Tokens two of whose k + 1 largest probabilities are equal."""
    n = 0
    for p in probs:
        top = sorted(p, reverse=True)[:k + 1]
        n += any(top[i] == top[i + 1] for i in range(len(top) - 1))
    return n


def rel_error(got, want):
    big = max((abs(v) for v in want), default=0.0)
    err = max((abs(a - b) for a, b in zip(got, want)), default=0.0)
    if len(got) != len(want) or any(math.isnan(v) for v in got):
        return math.inf
    return err / big if big > 0 else err


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    expect_ties = "--expect-ties" in sys.argv[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    d = args[0]
    with open(os.path.join(d, "manifest.json")) as fh:
        manifest = json.load(fh)
    cfg = manifest["config"]
    listed = {f["file"] for f in manifest["files"]}
    def load(name):
        if name not in listed:
            raise ValueError(f"{name} is not listed in manifest.json")
        return read_npy(os.path.join(d, name))[1]

    names = expert_params(cfg)
    layer = Layer(cfg, {n: load(f"param.{n}.npy") for n in ("wg",) + names})
    groups = cfg["mp_groups"]
    inputs = [(load("input.x.npy" if g == 0 else f"input.x.g{g}.npy"),
               load("input.dout.npy" if g == 0 else f"input.dout.g{g}.npy"))
              for g in range(groups)]
    T, k = cfg["tokens"], cfg["topk"]
    fails, checks = 0, 0

    def check(ok, what):
        nonlocal fails, checks
        checks += 1
        fails += 0 if ok else 1
        print(f"{'ok:  ' if ok else 'FAIL:'} {what}")

    recomputed = {}  # by gate slices
    for source, about in sorted(manifest.get("sources", {}).items()):
        slices = about["gate_slices"]
        if slices not in recomputed:
            grads = {n: [0.0] * len(layer.p[n]) for n in names}
            runs = [layer.run(x, dout, slices, grads) for x, dout in inputs]
            recomputed[slices] = (runs, grads)
        runs, grads = recomputed[slices]
        _, expert, slot, out = runs[0]
        flat_expert = [e for row in expert for e in row]
        flat_slot = [s for row in slot for s in row]
        same = (load(f"{source}.expert.npy") == flat_expert and
                load(f"{source}.slot.npy") == flat_slot and
                load(f"{source}.kept.npy") == [int(s >= 0) for s in flat_slot])
        dropped = sum(s < 0 for s in flat_slot)
        check(same, f"{source}: routing of MP group 0 (T={T}, k={k}, {slices} gate call(s), "
                    f"{dropped} dropped) equals the recomputed one")
        tol = ORACLE_TOLERANCE if source.startswith("oracle") else cfg["tolerance"]
        err = rel_error(load(f"{source}.out.npy"), out)
        check(err <= tol, f"{source}: out of MP group 0, error {err:.2e} (tolerance {tol:.0e})")
        for n in names:
            err = rel_error(load(f"{source}.d{n}.npy"), grads[n])
            check(err <= tol, f"{source}: d{n} summed over {groups} MP groups, error {err:.2e} "
                              f"(tolerance {tol:.0e})")
    check(bool(recomputed), "the manifest lists at least one source")
    if expect_ties:
        ties = sum(tie_decided(run[0], k) for runs, _ in recomputed.values() for run in runs)
        check(ties > 0, f"{ties} token routings decided by the tie rule")
    print(f"recompute_dump: {checks - fails} passed, {fails} failed")
    return 0 if fails == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
