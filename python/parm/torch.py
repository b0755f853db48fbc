"""parm.torch.MoE: Parm's distributed MoE layer (docs/spec.md §2, schedules of docs/spec.md §3) as a
torch.nn.Module.

Tensors cross into Parm as DLPack capsules, without copies: the input, the parameters, and
the tensors the output, the input gradient and the parameter gradients are written into are
torch tensors whose memory Parm computes on in place. Parm checks each (parm/_core:
python/dlpack_tensor.cpp): a contiguous float32 tensor on parm.device() (device="cuda":
this rank's GPU) of the expected shape; anything else is refused with a ValueError naming
what is wrong (nothing is converted or made contiguous silently). The C++ layer copies x
into its own step buffer (it keeps it for the backward pass), as it does for its other
callers; the output is written straight into the returned tensor.
"""
import torch
import torch.utils.dlpack

from . import _core, _dlpack

_SCHEDULES = ("auto", "baseline", "s1", "s2")
_FUSE = ("auto", "on", "off")
_ROUTER_SCORES = ("softmax", "sigmoid")
_EXPERT_MLPS = ("gelu", "swiglu")
# The parameters of each expert kind (docs/spec.md §8) and of its shared experts (§9), and the
# fixed order the C++ layer takes them in (None where the layer has none).
_PARAMS = {"gelu": ("wg", "w1", "b1", "w2", "b2"), "swiglu": ("wg", "w1", "w2", "w3")}
_SHARED = {"gelu": ("sw1", "sb1", "sw2", "sb2"), "swiglu": ("sw1", "sw2", "sw3")}
_SLOTS = ("wg", "w1", "b1", "w2", "b2", "w3", "sw1", "sb1", "sw2", "sb2", "sw3", "swg")
# Whole on every rank (not sharded over ep, esp or mp).
_WHOLE = ("wg", "sb2", "swg")


_OP = "parm.torch.MoE"


_gemm_threads = None  # what Parm's CPU GEMMs were last told


def _follow_torch_threads():
    """Parm's CPU GEMMs run with torch's intra-op thread count (torch.get_num_threads(): set
    by torch.set_num_threads or OMP_NUM_THREADS; torchrun and scripts/parmrun set 1 per
    rank). Both run on the process's one OpenMP runtime, whose count per calling thread is
    shared: Parm setting its own (1 per rank by default) would change torch's."""
    global _gemm_threads
    n = torch.get_num_threads()
    if n != _gemm_threads:
        _core.set_gemm_threads(n)
        _gemm_threads = n


def _flat(t):
    """t as (T, M) where its memory allows; otherwise t itself, which Parm refuses naming
    its strides."""
    return t.view(-1, t.shape[-1]) if t.is_contiguous() else t


def _empty(shape):
    """An uninitialised float32 tensor on the layer's device in memory Parm owns and reuses
    once torch frees the tensor (python/tensor_pool.h): already-mapped memory for the
    outputs and gradients the layer writes, without copies."""
    return torch.utils.dlpack.from_dlpack(_core.empty(list(shape)))


def _dl(tensors, names):
    return [_dlpack(t, n, _OP) for t, n in zip(tensors, names)]


def _layer_args(tensors, names):
    """The tensors in the C++ layer's order, None for those the layer has not."""
    by_name = dict(zip(names, _dl(tensors, names)))
    return [by_name.get(n) for n in _SLOTS]


class _MoEFunction(torch.autograd.Function):
    """out, l_aux = layer(x) with the parameters as inputs, so that autograd sees them (and
    refuses a backward after they were changed in place). x: (T, M) or (B, L, M); out: None
    (a new tensor) or the tensor of x's shape to write the output into (marked modified in
    place)."""

    @staticmethod
    def forward(ctx, x, layer, out, names, *params):
        _follow_torch_threads()
        layer.set_params(_layer_args(params, names))
        if out is None:
            out = _empty(x.shape)
        else:
            ctx.mark_dirty(out)
        l_aux = layer.forward(_dlpack(_flat(x), "x", _OP), _dlpack(_flat(out), "out", _OP))
        ctx.layer = layer
        ctx.names = names
        ctx.forward_id = layer.forwards()
        ctx.save_for_backward(*params)
        return out, torch.tensor(l_aux, dtype=x.dtype, device=x.device)

    @staticmethod
    def backward(ctx, dout, dl_aux):
        params = ctx.saved_tensors  # what the layer's last forward (ctx.forward_id) read
        layer = ctx.layer
        # Autograd's incoming gradient may be an expanded or strided view; the layer reads
        # (T, M) row-major (the one copy here, and only for such a view).
        dout = dout.contiguous()
        grads = [_empty(p.shape) for p in params]
        dx = _empty(dout.shape)
        _follow_torch_threads()
        layer.set_grads(_layer_args(grads, ctx.names))
        layer.backward(ctx.forward_id, _dlpack(_flat(dout), "the output gradient", _OP),
                       float(dl_aux), _dlpack(_flat(dx), "the input gradient", _OP))
        return (dx, None, None, None, *grads)


class MoE(torch.nn.Module):
    """A Mixture-of-Experts layer: top-k gating with capacity and GShard priority order,
    E experts y = gelu(x W1 + b1) W2 + b2 (expert_mlp="gelu", the default) or
    y = (silu(x W1) * (x W3)) W2 without biases (expert_mlp="swiglu": Mixtral's, DeepSeek's),
    distributed over parm.init's layout.

    model_dim M, hidden H (each expert's FFN width), experts E, topk k, capacity_factor f (a
    decimal string, kept exact: C = ceil(k f T / E); None: dropless, no token dropped).
    schedule: "baseline", "s1", "s2", or
    "auto" (the cost model picks per token count; needs profile=, a cost profile from
    `parm calibrate --out FILE`). fuse: fused dispatch/combine collectives for S1/S2, "on",
    "off" or "auto" (the cost model with a profile; "on" without one). precision: of the
    expert products, "fp32" or "bf16". seed: the parameters' initial values (the same draws
    as `parm check-layer --seed`).

    The router (docs/spec.md §7; the `--router-*` flags of the CLI): router_score "softmax"
    or "sigmoid" (DeepSeek-V3's scores; l_aux's p is then each token's scores normalised to
    sum 1), router_topk_norm (the k combine weights divided by their sum, when k > 1),
    router_scale (the combine weights times it), router_groups G and router_group_topk K_g
    (group-limited routing: the top-k is taken within the K_g best of G groups of E / G
    consecutive experts, a group's score the sum of its two best scores; with G = ep, each
    token reaches at most K_g EP ranks). The defaults are the softmax top-k above.

    Shared experts (docs/spec.md §9): shared_experts N_s FFNs of the routed kind and width
    shared_hidden (default: hidden) that every token passes through, their sum added to the
    routed output, times sigmoid(x swg) with shared_gate=True; split over mp like a dense FFN
    (parameters sw1 (N_s, M, H_s/mp), sw2, sw3 or sb1 likewise, sb2 (N_s, M) and swg (M)
    whole). shared_overlap=True (Megatron's --moe-shared-expert-overlap; the CLI's
    --shared-overlap on): schedules s1 and s2 compute the shared experts while the dispatch
    AllToAll is in flight (where it is not fused and ep > 1), forward and backward; how the
    layer runs, not what it computes: the results are bit-identical to shared_overlap=False
    (the default). It needs shared_experts >= 1.

    pad_to_capacity (with a capacity factor; the CLI's --pad-to-capacity): True (the
    default) moves whole capacity buffers, E x C rows with the empty slots, through the
    exchanges (GShard, DeepSpeed-MoE); False moves the kept rows only, as dropless routing
    does (Megatron-Core's default). How the layer runs, not what it computes.

    forward(x, out=None): x (T, M) or (B, L, M), the tokens of this rank's MP group (the
    same x on every rank of the group); returns the output of the same shape and sets
    self.l_aux, the auxiliary loss, a 0-d tensor in the autograd graph. The layer writes the
    output straight into the returned tensor's memory: a new one, or `out` (a contiguous
    float32 tensor of x's shape on the layer's device that does not require grad) when
    given, which is then returned (modified in place).

    Parameters: wg (M, E) whole on every rank; w1 (E/ep, M, H/esp), b1 (E/ep, H/esp),
    w2 (E/ep, H/esp, M), b2 (E/ep, M): this rank's expert shards (swiglu: w1, w2 and
    w3 (E/ep, M, H/esp), split like w1; no b1, b2). Their .grad is this rank's gradient
    (summing it over data-parallel replicas is the caller's, as with DDP). state_dict()
    holds whole tensors wg (M, E), w1 (E, M, H), b1 (E, H), w2 (E, H, M), b2 (E, M) (swiglu:
    wg, w1, w2, w3 (E, M, H)) on every rank (collective: call it on every rank), and
    load_state_dict takes them into any layout.
    """

    def __init__(self, model_dim, hidden, experts, topk=2, capacity_factor="1.2",
                 schedule="auto", fuse="auto", profile=None, precision="fp32", seed=0,
                 router_score="softmax", router_topk_norm=True, router_scale=1.0,
                 router_groups=1, router_group_topk=1, expert_mlp="gelu", shared_experts=0,
                 shared_hidden=None, shared_gate=False, shared_overlap=False,
                 pad_to_capacity=True):
        super().__init__()
        if not _core.initialized():
            raise RuntimeError("parm.torch.MoE before parm.init(): call parm.init(mp=, ep=, "
                               "esp=) first")
        for name, v in (("model_dim", model_dim), ("hidden", hidden), ("experts", experts),
                        ("topk", topk), ("seed", seed), ("router_groups", router_groups),
                        ("router_group_topk", router_group_topk),
                        ("shared_experts", shared_experts)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"parm.torch.MoE: {name} must be an int, got {v!r}")
        if capacity_factor is None:
            capacity_factor = "none"  # dropless routing
        if not isinstance(capacity_factor, str):
            raise ValueError(f"parm.torch.MoE: capacity_factor must be a decimal string such "
                             f"as \"1.2\" (kept exact), or None for dropless routing, got "
                             f"{capacity_factor!r}")
        if shared_hidden is None:
            shared_hidden = hidden if shared_experts > 0 else 0
        if not isinstance(shared_hidden, int) or isinstance(shared_hidden, bool):
            raise ValueError(f"parm.torch.MoE: shared_hidden must be an int, got "
                             f"{shared_hidden!r}")
        if not isinstance(shared_gate, bool):
            raise ValueError(f"parm.torch.MoE: shared_gate must be True or False, got "
                             f"{shared_gate!r}")
        if not isinstance(shared_overlap, bool):
            raise ValueError(f"parm.torch.MoE: shared_overlap must be True or False, got "
                             f"{shared_overlap!r}")
        if not isinstance(pad_to_capacity, bool):
            raise ValueError(f"parm.torch.MoE: pad_to_capacity must be True or False, got "
                             f"{pad_to_capacity!r}")
        if shared_overlap and shared_experts == 0:
            raise ValueError("parm.torch.MoE: shared_overlap=True needs shared experts: set "
                             "shared_experts >= 1, or shared_overlap=False")
        if expert_mlp not in _EXPERT_MLPS:
            raise ValueError(f"parm.torch.MoE: expert_mlp {expert_mlp!r} is not valid; use "
                             f"one of {', '.join(_EXPERT_MLPS)}")
        if router_score not in _ROUTER_SCORES:
            raise ValueError(f"parm.torch.MoE: router_score {router_score!r} is not valid; use "
                             f"one of {', '.join(_ROUTER_SCORES)}")
        if not isinstance(router_topk_norm, bool):
            raise ValueError(f"parm.torch.MoE: router_topk_norm must be True or False, got "
                             f"{router_topk_norm!r}")
        if isinstance(router_scale, bool) or not isinstance(router_scale, (int, float)):
            raise ValueError(f"parm.torch.MoE: router_scale must be a number, got "
                             f"{router_scale!r}")
        if schedule not in _SCHEDULES:
            raise ValueError(f"parm.torch.MoE: schedule {schedule!r} is not valid; use one of "
                             f"{', '.join(_SCHEDULES)}")
        if fuse not in _FUSE:
            raise ValueError(f"parm.torch.MoE: fuse {fuse!r} is not valid; use one of "
                             f"{', '.join(_FUSE)}")
        if schedule == "auto" and profile is None:
            raise ValueError(
                "parm.torch.MoE: schedule='auto' needs a cost profile (Parm has no built-in "
                "cost model defaults): run `scripts/parmrun -n 4 -- calibrate --out "
                "profile.json` once on this machine and pass profile='profile.json', or "
                "choose schedule='baseline', 's1' or 's2'")
        # Parm's checks of the sizes and the router against the layout, and this rank's
        # shards of them.
        self._router = (router_score, router_topk_norm, float(router_scale), router_groups,
                        router_group_topk, expert_mlp, shared_experts, shared_hidden,
                        shared_gate, shared_overlap, pad_to_capacity)
        self.expert_mlp = expert_mlp
        self.shared_experts, self.shared_hidden = shared_experts, shared_hidden
        self.shared_gate, self.shared_overlap = shared_gate, shared_overlap
        self.pad_to_capacity = pad_to_capacity
        self._names = _PARAMS[expert_mlp] + (_SHARED[expert_mlp] if shared_experts > 0 else ()) \
            + (("swg",) if shared_gate else ())
        self._shards = _core.expert_shards(model_dim, hidden, experts, topk, capacity_factor,
                                           self._router)
        self.model_dim, self.hidden, self.experts, self.topk = model_dim, hidden, experts, topk
        self.capacity_factor, self.schedule, self.fuse = capacity_factor, schedule, fuse
        self.profile, self.precision = profile, precision
        self._device = _core.device()
        self._edp_rank = _core.group_rank("edp")
        self._layer = None  # the C++ layer for the last token count
        self._layer_tokens = None
        self.l_aux = None
        self.schedule_used = None  # what the last forward ran: "s2+fused", "baseline", ...
        # ("+shared-overlap" after it where the shared experts overlapped the dispatch)

        whole = self._empty_whole()
        _core.init_params(model_dim, hidden, experts, seed, self._router,
                          dict(zip(whole, _dl(whole.values(), whole))))
        shards = self._shards_of(whole)
        for name in self._names:
            setattr(self, name, torch.nn.Parameter(shards[name].to(self._device).contiguous()))
        # Whole tensors in, this rank's shards out: the state dict's layout.
        self._register_load_state_dict_pre_hook(self._load_whole, with_module=False)

    # ---- the layer ----------------------------------------------------------------------

    def _layer_for(self, tokens):
        if self._layer is not None and self._layer_tokens == tokens:
            return self._layer
        kind, fused = self.schedule, self.fuse != "off"
        if self.profile is not None and (self.schedule == "auto" or self.fuse == "auto"):
            kinds = ["baseline", "s1", "s2"] if self.schedule == "auto" else [self.schedule]
            modes = [False, True] if self.fuse == "auto" else [self.fuse == "on"]
            kind, fused = _core.choose_schedule(tokens, self.model_dim, self.hidden,
                                                self.experts, self.topk, self.capacity_factor,
                                                self._router, str(self.profile), kinds, modes)
        layer = _core.Layer(tokens, self.model_dim, self.hidden, self.experts, self.topk,
                            self.capacity_factor, self._router, kind, fused, self.precision)
        info, sh = layer.shard_info(), self._shards
        assert info[:3] == [sh["local_experts"], sh["shard_hidden"], sh["first_expert"]], info
        self._layer, self._layer_tokens = layer, tokens
        self.schedule_used = layer.schedule_name()
        return layer

    def forward(self, x, out=None):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{_OP}: x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() not in (2, 3) or x.shape[-1] != self.model_dim:
            raise ValueError(f"{_OP}: x has shape {tuple(x.shape)}; the layer takes "
                             f"(T, {self.model_dim}) or (B, L, {self.model_dim})")
        tokens = x.numel() // self.model_dim
        if tokens < 1:
            raise ValueError(f"{_OP}: x has shape {tuple(x.shape)}: no tokens")
        if out is not None:
            if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                raise ValueError(f"{_OP}: out must be a tensor of x's shape {tuple(x.shape)}, "
                                 f"got {tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
            if out.requires_grad or out._base is not None:
                raise ValueError(f"{_OP}: out must be a tensor that does not require grad and "
                                 f"is not a view of another (autograd's rule for a tensor a "
                                 f"function overwrites and returns with another output)")
        layer = self._layer_for(tokens)
        y, l_aux = _MoEFunction.apply(x, layer, out, self._names,
                                      *[getattr(self, n) for n in self._names])
        self.l_aux = l_aux
        return y

    def extra_repr(self):
        return (f"model_dim={self.model_dim}, hidden={self.hidden}, experts={self.experts}, "
                f"topk={self.topk}, capacity_factor={self.capacity_factor!r}, "
                f"schedule={self.schedule!r}, fuse={self.fuse!r}, precision={self.precision!r}"
                + self._router_repr())

    def _router_repr(self):
        names = ("router_score", "router_topk_norm", "router_scale", "router_groups",
                 "router_group_topk", "expert_mlp", "shared_experts", "shared_hidden",
                 "shared_gate", "shared_overlap", "pad_to_capacity")
        defaults = ("softmax", True, 1.0, 1, 1, "gelu", 0, 0, False, False, True)
        return "".join(f", {n}={v!r}" for n, v, d in zip(names, self._router, defaults)
                       if v != d)

    # ---- whole tensors <-> this rank's shards -------------------------------------------

    def _whole_shapes(self):
        M, H, E = self.model_dim, self.hidden, self.experts
        N, Hs = self.shared_experts, self.shared_hidden
        shapes = {"wg": (M, E), "w1": (E, M, H), "b1": (E, H), "w2": (E, H, M), "b2": (E, M),
                  "w3": (E, M, H), "sw1": (N, M, Hs), "sb1": (N, Hs), "sw2": (N, Hs, M),
                  "sb2": (N, M), "sw3": (N, M, Hs), "swg": (M,)}
        return {n: shapes[n] for n in self._names}

    def _empty_whole(self):
        return {n: torch.zeros(s, dtype=torch.float32) for n, s in self._whole_shapes().items()}

    def _shards_of(self, whole):
        sh = self._shards
        e0, el = sh["first_expert"], sh["local_experts"]
        h0, hs = sh["hidden_first"], sh["shard_hidden"]
        s0, ss = sh["mp_rank"] * sh["shared_shard_hidden"], sh["shared_shard_hidden"]
        cut = {"wg": lambda t: t,
               "sw1": lambda t: t[:, :, s0:s0 + ss],
               "sb1": lambda t: t[:, s0:s0 + ss],
               "sw2": lambda t: t[:, s0:s0 + ss, :],
               "sb2": lambda t: t,
               "sw3": lambda t: t[:, :, s0:s0 + ss],
               "swg": lambda t: t,
               "w1": lambda t: t[e0:e0 + el, :, h0:h0 + hs],
               "b1": lambda t: t[e0:e0 + el, h0:h0 + hs],
               "w2": lambda t: t[e0:e0 + el, h0:h0 + hs, :],
               "b2": lambda t: t[e0:e0 + el],
               "w3": lambda t: t[e0:e0 + el, :, h0:h0 + hs]}
        return {n: cut[n](whole[n]) for n in self._names}

    def whole_tensors(self, grads=False):
        """The whole (unsharded) parameters (from EDP rank 0's replicas), or with
        grads=True the whole expert gradients summed over every rank (over the EDP replicas,
        what data-parallel training all-reduces; b2 from the rank that adds it, once per ESP
        group) and this rank's wg gradient, as CPU tensors. Collective over the world: every rank calls it."""
        whole = self._empty_whole()
        src = {n: getattr(self, n) for n in self._names}
        if grads:
            src = {n: (p.grad if p.grad is not None else torch.zeros_like(p))
                   for n, p in src.items()}
        src = {n: t.detach().to("cpu") for n, t in src.items()}
        dst = self._shards_of(whole)
        routed = [n for n in self._names if not n.startswith("s") and n not in _WHOLE]
        shared = [n for n in self._names if n.startswith("s") and n not in _WHOLE]
        mp0 = self._shards["mp_rank"] == 0
        if grads or self._edp_rank == 0:  # the EP x ESP shards, from EDP rank 0 (or summed)
            for n in routed:
                if n != "b2":
                    dst[n].copy_(src[n])
            if "b2" in self._names and self._shards["adds_b2"]:
                dst["b2"].copy_(src["b2"])
        if grads or self._shards["dp_rank"] == 0:  # the MP shards, from DP rank 0
            for n in shared:
                dst[n].copy_(src[n])
            for n in ("sb2", "swg"):  # whole on every MP rank: once per MP group
                if n in self._names and mp0:
                    dst[n].copy_(src[n])
        for n in self._names:
            if n != "wg":
                _core.allreduce_sum(_dlpack(whole[n], n, _OP))
        whole["wg"] = src["wg"].clone()
        return whole

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for n, t in self.whole_tensors().items():
            destination[prefix + n] = t

    def _load_whole(self, state_dict, prefix, local_metadata, strict, missing_keys,
                    unexpected_keys, error_msgs):
        shapes = self._whole_shapes()
        whole = {}
        for n in self._names:
            key = prefix + n
            if key not in state_dict:
                continue
            t = state_dict[key]
            if tuple(t.shape) != shapes[n]:
                raise ValueError(f"parm.torch.MoE.load_state_dict: {key} has shape "
                                 f"{tuple(t.shape)}, the layer's whole {n} is {shapes[n]}")
            whole[n] = t.detach().to(torch.float32).cpu()
        shards = self._shards_of({**self._empty_whole(), **whole})
        # Replace the whole tensors by this rank's shards, which the default loader copies.
        for n in whole:
            state_dict[prefix + n] = shards[n].contiguous()
