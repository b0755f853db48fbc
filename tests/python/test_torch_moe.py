"""parm.torch.MoE against a pure-PyTorch fp64 MoE written here from docs/spec.md §2.

Run under mpirun at any world size (CTest: 1, 2 and 4 ranks); every rank runs every case of
the layouts its world size allows. PARM_TEST_BACKEND=torch runs the whole suite over the
torch.distributed backend instead (gloo, started beside MPI: parm.init's "auto" then picks
torch; CTest: python_test_torch_moe_torch_np1/2/4). For each case the layer's output,
l_aux, input gradient and every parameter gradient must match the reference within check-layer's fp32 tolerance
(max |error| / max |reference| <= 2e-4). Then bad input must raise, never crash or hang.
Every failed check is printed (by the rank that saw it) and the run goes on; it exits
non-zero at the end when any check failed.
"""
import ctypes
import math
import os
import sys

import torch

import parm
import parm.launch
import parm.torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from parm_testlib import capacity  # noqa: E402

TOL = 2e-4  # check-layer's fp32 tolerance (moe/layer_check.h)
M, H, E, T = 8, 12, 4, 16  # T: tokens per MP group
DL_AUX = 0.5  # weight of l_aux in the loss, so its gradient path is checked

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"rank {parm.rank() if parm.initialized() else '?'}: FAIL {what}", flush=True)


def raises(exc, fn, what, contains=None):
    try:
        fn()
    except exc as e:
        if contains is not None and contains not in str(e):
            check(False, f"{what}: message {str(e)!r} lacks {contains!r}")
        return
    except Exception as e:  # noqa: BLE001 - the wrong kind is the failure reported
        check(False, f"{what}: raised {type(e).__name__} ({e}), expected {exc.__name__}")
        return
    check(False, f"{what}: did not raise {exc.__name__}")


# ---- the reference (docs/spec.md §2), fp64, autograd for the backward pass ---------------------

def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def route_scores(logits, router):
    """The router's scores (softmax or sigmoid of the logits) and the chosen experts (T, k)
    with their combine weights, docs/spec.md §2 and §7."""
    k = router["k"]
    sigmoid = router.get("router_score", "softmax") == "sigmoid"
    p = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=1)
    sel = p.detach().clone()
    groups, group_topk = router.get("router_groups", 1), router.get("router_group_topk", 1)
    if groups > 1:  # the K_g groups of best top-2 sums (ties to the lower group) stay open
        per_group = sel.shape[1] // groups
        g = sel.view(sel.shape[0], groups, per_group)
        gscore = g.topk(min(2, per_group), dim=2).values.sum(dim=2)
        keep = torch.sort(-gscore, dim=1, stable=True).indices[:, :group_topk]
        open_ = torch.zeros_like(gscore, dtype=torch.bool).scatter(1, keep, True)
        sel = sel.masked_fill(~open_.repeat_interleave(per_group, dim=1), -math.inf)
    # Top-k, ties to the lower expert index: a stable sort of -p keeps index order on ties.
    idx = torch.sort(-sel, dim=1, stable=True).indices[:, :k]
    top = p.gather(1, idx)
    norm = k > 1 and router.get("router_topk_norm", True)
    weight = router.get("router_scale", 1.0) * (top / top.sum(dim=1, keepdim=True) if norm
                                                 else top)
    # l_aux's p: the scores, under sigmoid normalised to sum 1 per token.
    balance = p / p.sum(dim=1, keepdim=True) if sigmoid else p
    return idx, weight, balance


def reference_moe(x, w, k, f, slices, router=None):
    """out (T, M), l_aux and the number of dropped choices for x (T, M) and whole weights
    w; the gate runs per slice of T / slices tokens (S1's gate calls). router: the
    parm.torch.MoE router arguments that differ from the defaults. Swiglu experts (w holds
    w3): y = (silu(x W1) * (x W3)) W2, no biases."""
    tokens, experts = x.shape[0], w["wg"].shape[1]
    idx, weight, p = route_scores(x @ w["wg"], {**(router or {}), "k": k})
    per = tokens // slices
    cap = capacity(k, f, per, experts)
    kept = torch.zeros(tokens, k, dtype=torch.bool)
    for s in range(slices):  # GShard order: all 1st choices in token order, then 2nd, ...
        fill = [0] * experts
        for j in range(k):
            for t in range(s * per, (s + 1) * per):
                e = int(idx[t, j])
                if fill[e] < cap:
                    fill[e] += 1
                    kept[t, j] = True
    out = torch.zeros_like(x)
    for e in range(experts):
        rows, choice = torch.nonzero((idx == e) & kept, as_tuple=True)
        if rows.numel() == 0:
            continue
        xr = x[rows]
        if "w3" in w:
            y = (torch.nn.functional.silu(xr @ w["w1"][e]) * (xr @ w["w3"][e])) @ w["w2"][e]
        else:
            y = gelu(xr @ w["w1"][e] + w["b1"][e]) @ w["w2"][e] + w["b2"][e]
        out = out.index_add(0, rows, weight[rows, choice].unsqueeze(1) * y)
    if "sw1" in w:  # shared experts (docs/spec.md §9): out += g sum_s FFN_s(x)
        shared = torch.zeros_like(x)
        for s in range(w["sw1"].shape[0]):
            if "sw3" in w:
                shared = shared + (torch.nn.functional.silu(x @ w["sw1"][s]) *
                                   (x @ w["sw3"][s])) @ w["sw2"][s]
            else:
                shared = shared + gelu(x @ w["sw1"][s] + w["sb1"][s]) @ w["sw2"][s] + w["sb2"][s]
        g = torch.sigmoid(x @ w["swg"]).unsqueeze(1) if "swg" in w else 1.0
        out = out + g * shared
    frac = torch.bincount(idx[:, 0], minlength=experts).double() / tokens
    l_aux = experts * (frac * p.mean(dim=0)).sum()
    return out, l_aux, int((~kept).sum())


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


# ---- the equivalence cases --------------------------------------------------------------

def whole_weights(seed, expert_mlp="gelu", shared=0, shared_gate=False):
    g = torch.Generator().manual_seed(seed)
    w = {"wg": torch.randn(M, E, generator=g) / math.sqrt(M),
         "w1": torch.randn(E, M, H, generator=g) / math.sqrt(M),
         "b1": 0.1 * torch.randn(E, H, generator=g),
         "w2": torch.randn(E, H, M, generator=g) / math.sqrt(H),
         "b2": 0.1 * torch.randn(E, M, generator=g)}
    if expert_mlp == "swiglu":  # W3 like W1, no biases
        del w["b1"], w["b2"]
        w["w3"] = torch.randn(E, M, H, generator=g) / math.sqrt(M)
    if shared > 0:  # shared experts of width H, of the same kind
        w["sw1"] = torch.randn(shared, M, H, generator=g) / math.sqrt(M)
        w["sw2"] = torch.randn(shared, H, M, generator=g) / math.sqrt(H)
        if expert_mlp == "swiglu":
            w["sw3"] = torch.randn(shared, M, H, generator=g) / math.sqrt(M)
        else:
            w["sb1"] = 0.1 * torch.randn(shared, H, generator=g)
            w["sb2"] = 0.1 * torch.randn(shared, M, generator=g)
        if shared_gate:
            w["swg"] = torch.randn(M, generator=g) / math.sqrt(M)
    return w


def group_data(seed, group):
    g = torch.Generator().manual_seed(1000 * seed + group)
    return torch.randn(T, M, generator=g), torch.randn(T, M, generator=g)


def run_case(layout, schedule, fuse, k, f, seed, precision="fp32", router=None):
    mp = layout[0]
    name = f"layout {layout} {schedule} fuse={fuse} k={k} f={f} {precision} {router or ''}"
    moe = parm.torch.MoE(M, H, E, topk=k, capacity_factor=f, schedule=schedule, fuse=fuse,
                         seed=seed, precision=precision, **(router or {}))
    r = router or {}
    weights = whole_weights(seed, r.get("expert_mlp", "gelu"), r.get("shared_experts", 0),
                            r.get("shared_gate", False))
    moe.load_state_dict(weights)  # whole tensors into this layout
    sd = moe.state_dict()
    for n, t in weights.items():
        check(sd[n].shape == t.shape and torch.equal(sd[n], t),
              f"{name}: state_dict()['{n}'] is not the whole tensor loaded")

    groups = parm.world_size() // mp
    mine = parm.rank() // mp  # MP groups are contiguous blocks of mp ranks
    x, dout = group_data(seed, mine)
    x = x.clone().requires_grad_(True)
    out = moe(x)
    (out * dout).sum().add(DL_AUX * moe.l_aux).backward()
    check(moe.l_aux.dim() == 0, f"{name}: l_aux is not 0-d")

    # The reference for every MP group: expert gradients are compared summed over them.
    slices = mp if schedule == "s1" else 1
    w64 = {n: t.double().requires_grad_(True) for n, t in weights.items()}
    drops = 0
    for g in range(groups):
        xg, dg = group_data(seed, g)
        xg = xg.double().requires_grad_(True)
        ro, rl, dropped = reference_moe(xg, w64, k, f, slices, router)
        drops += dropped
        wg_before = w64["wg"].grad.clone() if w64["wg"].grad is not None else 0
        (ro * dg.double()).sum().add(DL_AUX * rl).backward()
        if g == mine:
            ref_out, ref_laux, ref_dx = ro.detach(), rl.detach(), xg.grad
            ref_dwg = w64["wg"].grad - wg_before
    errs = {"out": rel_err(out.detach(), ref_out),
            "l_aux": abs(float(moe.l_aux) - float(ref_laux)) / max(1.0, abs(float(ref_laux))),
            "dx": rel_err(x.grad, ref_dx),
            "dwg": rel_err(moe.wg.grad, ref_dwg)}
    grads = moe.whole_tensors(grads=True)
    for n in weights:
        if n != "wg":
            errs["d" + n] = rel_err(grads[n], w64[n].grad)
    for n, e in errs.items():
        check(e <= TOL, f"{name}: {n} error {e:.3g} > {TOL}")
    return drops


def layouts(world):
    return {1: [(1, 1, 1)],
            2: [(1, 2, 1), (2, 1, 2), (2, 2, 1)],
            4: [(2, 2, 2), (4, 1, 4), (1, 4, 1), (2, 1, 2)]}.get(world, [(1, world, 1)])


def schedules(layout):
    mp, _, esp = layout
    out = [("s1", "off"), ("s1", "on"), ("s2", "off"), ("s2", "on")]
    if mp == 1 or esp == 1 or esp == mp:
        out.insert(0, ("baseline", "off"))
    return out


def equivalence(world):
    cases = 0
    for layout in layouts(world):
        parm.init(*layout)
        for schedule, fuse in schedules(layout):
            for k in (1, 2, 3):
                # "0.5": drops (checked below); "4.0": C >= T_gate, nothing drops.
                for f in ("0.5", "4.0"):
                    drops = run_case(layout, schedule, fuse, k, f, seed=7 + k)
                    check((drops > 0) == (f == "0.5"),
                          f"layout {layout} {schedule} k={k} f={f}: {drops} drops")
                    cases += 1
    return cases


# The router options of docs/spec.md §7 (E = 4: two groups of two experts, or four of one).
ROUTERS = ({"router_score": "sigmoid", "router_scale": 2.5},
           {"router_topk_norm": False, "router_groups": 2, "router_group_topk": 1},
           {"router_score": "sigmoid", "router_groups": 4, "router_group_topk": 2},
           # SwiGLU experts (docs/spec.md §8), alone and under DeepSeek-V3's router.
           {"expert_mlp": "swiglu"},
           {"expert_mlp": "swiglu", "router_score": "sigmoid", "router_groups": 2,
            "router_group_topk": 1},
           # Shared experts (docs/spec.md §9; H = 12 divides every layout's mp), gated or not.
           {"shared_experts": 2},
           {"expert_mlp": "swiglu", "shared_experts": 1, "shared_gate": True,
            "router_score": "sigmoid"})


def router_options(world):
    cases = 0
    for layout in layouts(world):
        parm.init(*layout)
        for schedule, fuse in schedules(layout):
            for router in ROUTERS:
                run_case(layout, schedule, fuse, 2, "0.5", seed=17, router=router)
                cases += 1
    return cases


# ---- the shared experts' overlap --------------------------------------------------------

def passes(moe, seed, layout):
    """One forward and backward of moe on the MP group's data for `seed`: the output, l_aux,
    the input gradient and every parameter gradient, by name."""
    x, dout = group_data(seed, parm.rank() // layout[0])
    x = x.clone().requires_grad_(True)
    out = moe(x)
    (out * dout).sum().add(DL_AUX * moe.l_aux).backward()
    r = {"out": out.detach(), "l_aux": moe.l_aux.detach(), "dx": x.grad}
    r.update({"d" + n: getattr(moe, n).grad for n in moe._names})
    return r


def shared_overlap(world):
    """shared_overlap=True (the shared experts computed while the dispatch AllToAll is in
    flight) moves where their compute sits, not what it computes: the output, l_aux, the
    input gradient and every parameter gradient equal those of shared_overlap=False bit for
    bit, under every layout's S1 and S2, fused and not, with drops and without; and it ran
    overlapped (schedule_used says so) wherever the dispatch AllToAll exists (ep > 1) and is
    not fused (fuse off, or esp 1)."""
    cases = 0
    for layout in layouts(world):
        parm.init(*layout)
        _, ep, esp = layout
        for schedule, fuse in schedules(layout):
            if schedule == "baseline":  # DeepSpeed-MoE's steps, one after another
                continue
            for f, router in (("0.5", {"shared_experts": 1}),
                              ("4.0", {"expert_mlp": "swiglu", "shared_experts": 2,
                                       "shared_gate": True})):
                got = []
                for overlap in (False, True):
                    moe = parm.torch.MoE(M, H, E, topk=2, capacity_factor=f, schedule=schedule,
                                         fuse=fuse, seed=31, shared_overlap=overlap, **router)
                    got.append((passes(moe, 31, layout), moe.schedule_used))
                name = f"shared_overlap layout {layout} {schedule} fuse={fuse} f={f} {router}"
                (off, used_off), (on, used_on) = got
                diff = [k for k in off if not torch.equal(off[k], on[k])]
                check(not diff, f"{name}: {diff} differ from shared_overlap=False")
                want = ep > 1 and (fuse == "off" or esp == 1)
                check(("+shared-overlap" in used_on) == want and "+shared-overlap" not in used_off,
                      f"{name}: ran {used_on!r} (off: {used_off!r}); overlapped expected {want}")
                cases += 1
    return cases


def pad_to_capacity(world):
    """pad_to_capacity=False (the exchanges move the kept rows only) changes how the layer
    runs, not what it computes: the output, l_aux, the input gradient and every parameter
    gradient equal those of pad_to_capacity=True to rounding (S2 splits an expert's rows over
    the MP ranks evenly instead of by slots, so the sums of the weight gradients may group
    differently), under every layout's schedules, fused and not, with drops; and the layer
    names the option in its repr."""
    cases = 0
    for layout in layouts(world):
        parm.init(*layout)
        for schedule, fuse in schedules(layout):
            got = []
            for pad in (True, False):
                moe = parm.torch.MoE(M, H, E, topk=2, capacity_factor="0.5", schedule=schedule,
                                     fuse=fuse, seed=37, pad_to_capacity=pad)
                got.append((passes(moe, 37, layout), repr(moe)))
            name = f"pad_to_capacity layout {layout} {schedule} fuse={fuse}"
            (padded, rep_on), (unpadded, rep_off) = got
            diff = [k for k in padded
                    if not torch.allclose(padded[k], unpadded[k], rtol=1e-5, atol=1e-6)]
            check(not diff, f"{name}: {diff} differ from pad_to_capacity=True")
            check("pad_to_capacity=False" in rep_off and "pad_to_capacity" not in rep_on,
                  f"{name}: repr {rep_off!r} / {rep_on!r}")
            cases += 1
    return cases


# ---- bf16, and a state dict moved between layouts ---------------------------------------

def bf16(world):
    """precision="bf16" (CPU bf16 expert products) against the fp64 reference at the bf16
    tolerance of check-layer (2e-2); also swiglu experts with a gated shared expert."""
    global TOL
    layout = (2, world // 2, 2) if world >= 4 else (1, world, 1)
    parm.init(*layout)
    saved, TOL = TOL, 2e-2
    try:
        for k in (1, 2):
            run_case(layout, "s2", "on", k, "0.5", seed=11, precision="bf16")
        run_case(layout, "s1", "off", 2, "0.5", seed=11, precision="bf16",
                 router={"expert_mlp": "swiglu", "shared_experts": 1, "shared_gate": True})
    finally:
        TOL = saved


def state_dict_across_layouts(world):
    """A state dict saved under one layout loads under another and gives the same output
    for the same x (every rank feeds the same x, so every MP group's output is comparable)."""
    if world < 4:
        return
    x = torch.randn(T, M, generator=torch.Generator().manual_seed(99))
    parm.init(2, 2, 2)
    a = parm.torch.MoE(M, H, E, topk=2, capacity_factor="1.0", schedule="s2", fuse="on",
                       seed=21)
    sd, out_a = a.state_dict(), a(x).detach()
    parm.init(1, 4, 1)
    b = parm.torch.MoE(M, H, E, topk=2, capacity_factor="1.0", schedule="baseline", seed=22)
    b.load_state_dict(sd)
    out_b = b(x).detach()
    check(rel_err(out_b, out_a) <= TOL, f"state dict (2, 2, 2) -> (1, 4, 1): output error "
                                        f"{rel_err(out_b, out_a):.3g}")
    # Swiglu: w3 is sharded like w1, and there are no biases in the state dict.
    parm.init(2, 2, 2)
    a = parm.torch.MoE(M, H, E, topk=2, capacity_factor="1.0", schedule="s2", fuse="on",
                       seed=23, expert_mlp="swiglu")
    sd, out_a = a.state_dict(), a(x).detach()
    check(sorted(sd) == ["w1", "w2", "w3", "wg"], f"swiglu state dict keys {sorted(sd)}")
    parm.init(1, 4, 1)
    b = parm.torch.MoE(M, H, E, topk=2, capacity_factor="1.0", schedule="s2", seed=24,
                       expert_mlp="swiglu")
    b.load_state_dict(sd)
    out_b = b(x).detach()
    check(rel_err(out_b, out_a) <= TOL, f"swiglu state dict (2, 2, 2) -> (1, 4, 1): output "
                                        f"error {rel_err(out_b, out_a):.3g}")


# ---- gradcheck (one rank) ------------------------------------------------------------------

def gradcheck():
    """torch.autograd.gradcheck on a tiny layer: x and every parameter against finite
    differences (fp32, so with fp32-sized steps and tolerances; "4.0": nothing drops, and
    the steps are too small to change the routing)."""
    parm.init()
    for expert_mlp, shared in (("gelu", 0), ("swiglu", 0), ("gelu", 1), ("swiglu", 2)):
        moe = parm.torch.MoE(4, 6, 3, topk=2, capacity_factor="4.0", schedule="s2",
                             fuse="off", seed=3, expert_mlp=expert_mlp, shared_experts=shared,
                             shared_gate=shared == 2)
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(5), requires_grad=True)

        def fn(x, *params):
            moe._layer = None  # a fresh C++ layer per call: gradcheck runs forwards between
            # a forward and its backward, and a layer keeps the state of its last forward
            out, l_aux = parm.torch._MoEFunction.apply(x, moe._layer_for(x.shape[0]), None,
                                                        moe._names, *params)
            return out, l_aux

        params = [getattr(moe, n) for n in moe._names]
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not double precision": fp32 is what Parm does
            ok = torch.autograd.gradcheck(fn, (x, *params), eps=1e-3, atol=2e-3, rtol=2e-2,
                                          raise_exception=False)
        check(ok, f"torch.autograd.gradcheck on a tiny single-rank {expert_mlp} layer with "
                  f"{shared} shared experts")


# ---- bad input ----------------------------------------------------------------------------

def bad_input(world):
    parm.init(1, world, 1)
    moe = parm.torch.MoE(M, H, E, topk=2, schedule="s2", fuse="off")
    x = torch.randn(T, M)
    raises(ValueError, lambda: moe(x.double()), "float64 input", "float32")
    raises(ValueError, lambda: moe(torch.randn(M, T).t()), "non-contiguous input",
           "contiguous")
    raises(ValueError, lambda: moe(torch.randn(T, M + 1)), "wrong model dim", "shape")
    raises(ValueError, lambda: moe(torch.randn(T * M)), "1-D input", "shape")
    raises(ValueError, lambda: moe(torch.randn(0, M)), "no tokens", "no tokens")
    raises(TypeError, lambda: moe(x.numpy()), "numpy input", "torch.Tensor")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s3"), "schedule name", "s3")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, fuse="maybe"), "fuse name", "maybe")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E), "auto without a profile", "profile")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, topk=E + 1, schedule="s2"), "k > E")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, capacity_factor=1.2, schedule="s2"),
           "float capacity factor", "decimal string")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, capacity_factor="1.2.3", schedule="s2")(x),
           "bad capacity factor")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, precision="fp8", schedule="s2")(x),
           "bad precision")
    # The shared experts' overlap: a bool, and only with shared experts.
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s2", shared_experts=1,
                                              shared_overlap="on"),
           "shared_overlap not a bool", "shared_overlap must be True or False")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s2", shared_overlap=True),
           "shared_overlap without shared experts",
           "shared_overlap=True needs shared experts: set shared_experts >= 1")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s2", pad_to_capacity="off"),
           "pad_to_capacity not a bool", "pad_to_capacity must be True or False")
    # The experts' kind: the valid ones named (swiglu at bf16 runs: bf16() below).
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s2", expert_mlp="relu"),
           "expert_mlp", "swiglu")
    # The router's options, refused with the valid values named.
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s2", router_score="relu"),
           "router score", "sigmoid")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s2", router_topk_norm="on"),
           "router_topk_norm not a bool", "True or False")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s2", router_scale=0.0),
           "router scale 0", "positive")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s2", router_groups=3),
           "groups not dividing E", "must divide the 4 experts")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, schedule="s2", router_groups=2,
                                              router_group_topk=3),
           "group_topk > groups", "router-group-topk")
    raises(ValueError, lambda: parm.torch.MoE(M, H, E, topk=3, schedule="s2", router_groups=2,
                                              router_group_topk=1),
           "k > the chosen groups' experts", "exceeds the 2 experts")
    # Experts not divisible by ep, the layout refused with the valid values named.
    if world > 1:
        raises(ValueError, lambda: parm.torch.MoE(M, H, world + 1, schedule="s2"),
               "experts % ep", "multiple of ep")
    raises(ValueError, lambda: parm.init(mp=world + 1), "invalid layout")
    raises(ValueError, lambda: parm.init(mp=0), "mp 0")
    raises(ValueError, lambda: parm.init(device="tpu"), "device name", "tpu")
    # No GPU here (CPU torch, CPU build): device="cuda" is refused before anything starts.
    if not torch.cuda.is_available():
        raises(ValueError, lambda: parm.init(device="cuda"), "cuda without a GPU", "cuda")
    raises(ValueError, lambda: moe(x.half()), "float16 input", "float32")
    raises(ValueError, lambda: parm.allreduce_sum(torch.zeros(2, dtype=torch.float64)),
           "allreduce_sum of float64", "float32")
    raises(ValueError, lambda: parm.allreduce_sum(torch.zeros(2), "xp"), "allreduce_sum group",
           "xp")
    # A state dict of the wrong whole shape.
    sd = moe.state_dict()
    sd["w1"] = torch.zeros(E, M, H + 1)
    raises(ValueError, lambda: moe.load_state_dict(sd), "state_dict shape", "w1")
    # Backward of a stale forward: the layer keeps only its last forward's state.
    y1 = moe(x.clone().requires_grad_(True))
    moe(x)
    raises(RuntimeError, lambda: y1.sum().backward(), "stale backward", "backward")
    # The layer computes on the parameters' own memory (no copy): zeroed w2 and b2 give a
    # zero output.
    with torch.no_grad():
        moe.w2.zero_()
        moe.b2.zero_()
    check(float(moe(x).abs().max()) == 0.0, "the layer did not read the parameters' memory")


# ---- zero copy through DLPack --------------------------------------------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLManagedTensor(ctypes.Structure):  # dlpack.h (0.x): DLTensor, manager_ctx, deleter
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_keep = []  # the hand-made capsules' structs (they have no deleter)


def dl_capsule(t, shape, device_type=1, device_id=0, byte_offset=0, name=b"dltensor"):
    """A hand-made float32 DLPack capsule over t's memory (null strides: compact row-major),
    claiming the given device: what a producer other than torch (or a GPU tensor) hands in."""
    dims = (ctypes.c_int64 * len(shape))(*shape)
    m = _DLManagedTensor(t.data_ptr(), _DLDevice(device_type, device_id), len(shape),
                         _DLDataType(2, 32, 1), dims, None, byte_offset, None, None)
    _keep.append((m, dims, name))
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                   ctypes.c_void_p]
    return new(ctypes.addressof(m), name, None)


def zero_copy(world):
    """The layer writes its output into memory the caller's tensor owns, reads the caller's
    memory in place, and refuses what it cannot use in place."""
    parm.init(1, world, 1)
    moe = parm.torch.MoE(M, H, E, topk=2, schedule="s2", fuse="off", seed=5)
    x = torch.randn(T, M, generator=torch.Generator().manual_seed(3))
    # out=: the returned tensor is the caller's, written by the layer.
    buf = torch.full((T, M), float("nan"))
    y = moe(x, out=buf)
    check(y.data_ptr() == buf.data_ptr(), "out=: the output is not the caller's tensor")
    ref = moe(x).detach()
    check(torch.equal(buf, ref), "out=: the caller's tensor does not hold the output")
    # (B, L, M) with out= of that shape, and a backward through it.
    x3 = x.view(2, T // 2, M).clone().requires_grad_(True)
    buf3 = torch.empty(2, T // 2, M)
    y3 = moe(x3, out=buf3)
    check(y3.data_ptr() == buf3.data_ptr() and torch.equal(buf3.view(T, M), ref),
          "out= (B, L, M): not the caller's tensor or not the output")
    y3.sum().backward()
    check(x3.grad is not None and bool(torch.isfinite(x3.grad).all()),
          "backward through an out= forward gave no input gradient")
    # Without out=, the output is memory Parm owns, handed over by DLPack: freed by torch, it
    # returns to Parm's pool, and the next forward's output is that same memory.
    y = moe(x)
    p1 = y.data_ptr()
    del y
    y = moe(x)
    check(y.data_ptr() == p1, "the output is not the memory Parm owns and reuses")
    del y
    # A new output per forward: an earlier one is not overwritten by the next forward.
    y1 = moe(x).detach()
    y1_copy = y1.clone()
    moe(2 * x)
    check(torch.equal(y1, y1_copy), "a later forward overwrote an earlier output")
    # A DLPack capsule's memory is written in place, at its byte offset: a hand-made capsule
    # (no strides) over all but the first 4 floats of a tensor receives the output.
    layer = moe._layer_for(T)
    big = torch.full((T * M + 4,), float("nan"))
    layer.forward(dl_capsule(x, [T, M]), dl_capsule(big, [T, M], byte_offset=16))
    check(bool(big[:4].isnan().all()) and torch.equal(big[4:].view(T, M), ref),
          "a forward into a DLPack capsule at byte offset 16 missed its memory")
    # Refusals, from Parm's checks of the DLTensor.
    raises(ValueError, lambda: layer.forward(dl_capsule(x, [T, M], device_type=2),
                                             dl_capsule(buf, [T, M])),
           "x on a GPU (DLPack device cuda)", "cuda:0")
    raises(ValueError, lambda: layer.forward(dl_capsule(x, [T, M]), dl_capsule(buf, [M, T])),
           "output of the wrong shape", "shape")
    raises(ValueError, lambda: layer.forward(dl_capsule(x, [T, M], name=b"used_dltensor"),
                                             dl_capsule(buf, [T, M])),
           "a consumed capsule", "used_dltensor")
    raises(ValueError, lambda: moe(x, out=torch.empty(M, T).t().clone(
        memory_format=torch.preserve_format)), "non-contiguous out", "contiguous")
    raises(ValueError, lambda: moe(x, out=torch.empty(2 * T, M)[:T]), "out a view", "view")
    raises(ValueError, lambda: moe(x, out=torch.empty(T, M, dtype=torch.float64)),
           "float64 out", "float32")
    raises(ValueError, lambda: moe(x, out=torch.empty(T, M + 1)), "out of another shape", "out")
    raises(ValueError, lambda: moe(torch.randn(2, M, T // 2).transpose(1, 2)),
           "non-contiguous (B, L, M) input", "strides")
    raises(ValueError, lambda: moe(x.to(torch.bfloat16)), "bfloat16 input", "bfloat16")
    raises(ValueError, lambda: moe(torch.empty(T, M, device="meta")), "input on device meta")
    with torch.no_grad():
        moe.w1.data = moe.w1.data.double()
    raises(ValueError, lambda: moe(x), "float64 parameter", "w1")


def threads():
    """Parm's GEMMs follow torch's thread count and leave it as it was (they share the
    process's OpenMP runtime, whose count per thread Parm would otherwise set to 1 on its
    first GEMM when OMP_NUM_THREADS is unset). Runs before any other layer: Parm reads the
    variable on its first GEMM, which is unset here for that (torch read it at import)."""
    os.environ.pop("OMP_NUM_THREADS", None)
    moe = parm.torch.MoE(M, H, E, topk=2, schedule="s2", fuse="off")
    before = torch.get_num_threads()
    for n in (2, 1):
        torch.set_num_threads(n)
        x = torch.randn(T, M, requires_grad=True)
        moe(x).sum().backward()
        check(torch.get_num_threads() == n,
              f"torch threads {n} became {torch.get_num_threads()} after a forward+backward")
    torch.set_num_threads(before)


def exceptions():
    """Parm's error classes arrive as these Python exceptions, with Parm's message."""
    check(issubclass(parm.TimeoutError, TimeoutError), "parm.TimeoutError is a TimeoutError")
    raises(ValueError, lambda: parm._core._throw_for_test("config", "bad mp"), "InvalidConfig",
           "bad mp")
    raises(RuntimeError, lambda: parm._core._throw_for_test("error", "broken"), "Error",
           "broken")


def before_init():
    raises(RuntimeError, parm.rank, "parm.rank() before init", "parm.init")
    raises(RuntimeError, lambda: parm.group_ranks("ep"), "group_ranks before init",
           "parm.init")
    raises(RuntimeError, lambda: parm.torch.MoE(M, H, E), "MoE before init", "parm.init")


def main():
    before_init()
    exceptions()
    backend = os.environ.get("PARM_TEST_BACKEND", "mpi")
    if backend == "torch":
        parm.launch.init_process_group("gloo")
    parm.init()
    check(parm.backend() == backend, f"parm.backend() is {parm.backend()}, not {backend}")
    threads()
    world = parm.world_size()
    check(parm.group_ranks("world") == list(range(world)), "group_ranks('world')")
    raises(ValueError, lambda: parm.group_ranks("xp"), "group name", "xp")
    cases = (equivalence(world) + router_options(world) + shared_overlap(world)
             + pad_to_capacity(world))
    bf16(world)
    state_dict_across_layouts(world)
    if world == 1:
        gradcheck()
    bad_input(world)
    zero_copy(world)
    ok = not failures
    if parm.rank() == 0:
        print(f"test_torch_moe: {backend} world {world}: {cases} equivalence cases, "
              f"{'passed' if ok else f'{len(failures)} failures'}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
