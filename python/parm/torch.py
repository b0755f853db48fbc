"""parm.torch.MoE: Parm's distributed MoE layer (SPEC §2, schedules of SPEC §3) as a
torch.nn.Module.

Tensors cross into Parm as data pointers, without copies: the input, the parameters and
the buffers the outputs and gradients are written into are the caller's torch tensors.
They must be contiguous float32 tensors on parm.device(); anything else is refused with a
ValueError (nothing is converted silently). The C++ layer copies x into its own step buffer
and the output out of it, as it does for its other callers.
"""
import math

import torch

from . import _core

_SCHEDULES = ("auto", "baseline", "s1", "s2")
_FUSE = ("auto", "on", "off")
_PARAMS = ("wg", "w1", "b1", "w2", "b2")


def _check_tensor(name, t, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"parm.torch.MoE: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise ValueError(f"parm.torch.MoE: {name} has dtype {t.dtype}; the layer takes "
                         f"torch.float32 (convert with .float())")
    if t.device.type != device:
        raise ValueError(f"parm.torch.MoE: {name} is on {t.device}; the layer computes on "
                         f"{device} (parm.init(device=...))")
    if not t.is_contiguous():
        raise ValueError(f"parm.torch.MoE: {name} with shape {tuple(t.shape)} and strides "
                         f"{t.stride()} is not contiguous; pass x.contiguous()")


def _ptrs(tensors):
    return [t.data_ptr() for t in tensors]


class _MoEFunction(torch.autograd.Function):
    """out, l_aux = layer(x) with the parameters as inputs, so that autograd sees them (and
    refuses a backward after they were changed in place)."""

    @staticmethod
    def forward(ctx, x, layer, *params):
        layer.set_params(*_ptrs(params))
        out = torch.empty_like(x)
        l_aux = layer.forward(x.data_ptr(), out.data_ptr())
        ctx.layer = layer
        ctx.forward_id = layer.forwards()
        ctx.save_for_backward(*params)
        return out, torch.tensor(l_aux, dtype=x.dtype, device=x.device)

    @staticmethod
    def backward(ctx, dout, dl_aux):
        params = ctx.saved_tensors
        layer = ctx.layer
        dout = dout.contiguous()
        grads = [torch.empty_like(p) for p in params]
        dx = torch.empty_like(dout)
        layer.set_params(*_ptrs(params))
        layer.set_grads(*_ptrs(grads))
        layer.backward(ctx.forward_id, dout.data_ptr(), float(dl_aux), dx.data_ptr())
        return (dx, None, *grads)


class MoE(torch.nn.Module):
    """A Mixture-of-Experts layer: top-k gating with capacity and GShard priority order,
    E experts y = gelu(x W1 + b1) W2 + b2, distributed over parm.init's layout.

    model_dim M, hidden H (each expert's FFN width), experts E, topk k, capacity_factor f (a
    decimal string, kept exact: C = ceil(k f T / E); None: dropless, no token dropped).
    schedule: "baseline", "s1", "s2", or
    "auto" (the cost model picks per token count; needs profile=, a cost profile from
    `parm calibrate --out FILE`). fuse: fused dispatch/combine collectives for S1/S2, "on",
    "off" or "auto" (the cost model with a profile; "on" without one). precision: of the
    expert products, "fp32" or "bf16". seed: the parameters' initial values (the same draws
    as `parm check-layer --seed`).

    forward(x): x (T, M) or (B, L, M), the tokens of this rank's MP group (the same x on
    every rank of the group); returns the output of the same shape and sets self.l_aux, the
    auxiliary loss, a 0-d tensor in the autograd graph.

    Parameters: wg (M, E) whole on every rank; w1 (E/ep, M, H/esp), b1 (E/ep, H/esp),
    w2 (E/ep, H/esp, M), b2 (E/ep, M): this rank's expert shards. Their .grad is this rank's
    gradient (summing it over data-parallel replicas is the caller's, as with DDP).
    state_dict() holds whole tensors wg (M, E), w1 (E, M, H), b1 (E, H), w2 (E, H, M),
    b2 (E, M) on every rank (collective: call it on every rank), and load_state_dict takes
    them into any layout.
    """

    def __init__(self, model_dim, hidden, experts, topk=2, capacity_factor="1.2",
                 schedule="auto", fuse="auto", profile=None, precision="fp32", seed=0):
        super().__init__()
        if not _core.initialized():
            raise RuntimeError("parm.torch.MoE before parm.init(): call parm.init(mp=, ep=, "
                               "esp=) first")
        for name, v in (("model_dim", model_dim), ("hidden", hidden), ("experts", experts),
                        ("topk", topk), ("seed", seed)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"parm.torch.MoE: {name} must be an int, got {v!r}")
        if capacity_factor is None:
            capacity_factor = "none"  # dropless routing
        if not isinstance(capacity_factor, str):
            raise ValueError(f"parm.torch.MoE: capacity_factor must be a decimal string such "
                             f"as \"1.2\" (kept exact), or None for dropless routing, got "
                             f"{capacity_factor!r}")
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
        lay = _core.layout()
        if experts < 1 or experts % lay["ep"]:
            raise ValueError(f"parm.torch.MoE: experts {experts} must be a positive multiple "
                             f"of ep {lay['ep']}")
        if hidden < 1 or hidden % lay["esp"]:
            raise ValueError(f"parm.torch.MoE: hidden {hidden} must be a positive multiple of "
                             f"esp {lay['esp']}")
        if model_dim < 1 or not 1 <= topk <= experts:
            raise ValueError(f"parm.torch.MoE: need model_dim >= 1 and 1 <= topk <= experts; "
                             f"got model_dim {model_dim}, topk {topk}, experts {experts}")
        self.model_dim, self.hidden, self.experts, self.topk = model_dim, hidden, experts, topk
        self.capacity_factor, self.schedule, self.fuse = capacity_factor, schedule, fuse
        self.profile, self.precision = profile, precision
        self._device = _core.device()
        self._local_experts = experts // lay["ep"]
        self._shard_hidden = hidden // lay["esp"]
        self._first_expert = _core.group_rank("ep") * self._local_experts
        self._esp_rank = _core.group_rank("esp")
        self._edp_rank = _core.group_rank("edp")
        self._layer = None  # the C++ layer for the last token count
        self._layer_tokens = None
        self.l_aux = None
        self.schedule_used = None  # what the last forward ran: "s2+fused", "baseline", ...

        whole = self._empty_whole()
        _core.init_params(model_dim, hidden, experts, seed, *_ptrs(whole.values()))
        shards = self._shards_of(whole)
        for name in _PARAMS:
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
                                                str(self.profile), kinds, modes)
        layer = _core.Layer(tokens, self.model_dim, self.hidden, self.experts, self.topk,
                            self.capacity_factor, kind, fused, self.precision)
        info = layer.shard_info()
        assert info[:3] == [self._local_experts, self._shard_hidden, self._first_expert], info
        self._layer, self._layer_tokens = layer, tokens
        self.schedule_used = layer.schedule_name()
        return layer

    def forward(self, x):
        _check_tensor("x", x, self._device)
        if x.dim() not in (2, 3) or x.shape[-1] != self.model_dim:
            raise ValueError(f"parm.torch.MoE: x has shape {tuple(x.shape)}; the layer takes "
                             f"(T, {self.model_dim}) or (B, L, {self.model_dim})")
        x2 = x.view(-1, self.model_dim)
        if x2.shape[0] < 1:
            raise ValueError(f"parm.torch.MoE: x has shape {tuple(x.shape)}: no tokens")
        params = [getattr(self, n) for n in _PARAMS]
        for n, p in zip(_PARAMS, params):
            _check_tensor(n, p, self._device)
        layer = self._layer_for(x2.shape[0])
        out, l_aux = _MoEFunction.apply(x2, layer, *params)
        self.l_aux = l_aux
        return out.view(x.shape)

    def extra_repr(self):
        return (f"model_dim={self.model_dim}, hidden={self.hidden}, experts={self.experts}, "
                f"topk={self.topk}, capacity_factor={self.capacity_factor!r}, "
                f"schedule={self.schedule!r}, fuse={self.fuse!r}, precision={self.precision!r}")

    # ---- whole tensors <-> this rank's shards -------------------------------------------

    def _whole_shapes(self):
        M, H, E = self.model_dim, self.hidden, self.experts
        return {"wg": (M, E), "w1": (E, M, H), "b1": (E, H), "w2": (E, H, M), "b2": (E, M)}

    def _empty_whole(self):
        return {n: torch.zeros(s, dtype=torch.float32) for n, s in self._whole_shapes().items()}

    def _shards_of(self, whole):
        e0, el = self._first_expert, self._local_experts
        h0, hs = self._esp_rank * self._shard_hidden, self._shard_hidden
        return {"wg": whole["wg"],
                "w1": whole["w1"][e0:e0 + el, :, h0:h0 + hs],
                "b1": whole["b1"][e0:e0 + el, h0:h0 + hs],
                "w2": whole["w2"][e0:e0 + el, h0:h0 + hs, :],
                "b2": whole["b2"][e0:e0 + el]}

    def whole_tensors(self, grads=False):
        """The whole (unsharded) parameters (from EDP rank 0's replicas), or with
        grads=True the whole expert gradients summed over every rank (over the EDP replicas,
        what data-parallel training all-reduces; b2 once per ESP group) and this rank's wg
        gradient, as CPU tensors. Collective over the world: every rank calls it."""
        whole = self._empty_whole()
        src = {n: getattr(self, n) for n in _PARAMS}
        if grads:
            src = {n: (p.grad if p.grad is not None else torch.zeros_like(p))
                   for n, p in src.items()}
        src = {n: t.detach().to("cpu") for n, t in src.items()}
        if grads or self._edp_rank == 0:
            dst = self._shards_of(whole)
            for n in ("w1", "b1", "w2"):
                dst[n].copy_(src[n])
            if self._esp_rank == 0:
                dst["b2"].copy_(src["b2"])
        for n in ("w1", "b1", "w2", "b2"):
            _core.allreduce_sum(whole[n].data_ptr(), whole[n].numel())
        whole["wg"] = src["wg"].clone()
        return whole

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for n, t in self.whole_tensors().items():
            destination[prefix + n] = t

    def _load_whole(self, state_dict, prefix, local_metadata, strict, missing_keys,
                    unexpected_keys, error_msgs):
        shapes = self._whole_shapes()
        whole = {}
        for n in _PARAMS:
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
