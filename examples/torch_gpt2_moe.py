#!/usr/bin/env python3
"""A small GPT-2 in plain PyTorch whose FFN blocks alternate with parm.torch.MoE, trained on
the King James Bible (Debian's bible-kjv, byte-level tokens) with a stock torch optimizer,
the dense parameters in torch's DistributedDataParallel.

    torchrun --nproc_per_node 4 examples/torch_gpt2_moe.py --ep 2 --esp 2
    (Debian's torchrun on Python 3.11: scripts/torchrun, the same with its crash fixed)
    mpirun -np 4 /usr/bin/python3 examples/torch_gpt2_moe.py --ep 2 --esp 2 [--backend mpi]
    (this machine: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
     mpirun -np 4 --oversubscribe --bind-to none /usr/bin/python3 examples/torch_gpt2_moe.py
     --ep 2 --esp 2; with the package not installed, PYTHONPATH=build/python)

torch.distributed is started from the launcher's variables (parm.launch.init_process_group:
torchrun's, or Open MPI's under mpirun); Parm runs over its groups (--backend auto/torch:
parm.group("dp"), parm.group("edp") are torch groups) or over its own MPI (--backend mpi,
under mpirun; DDP then gets torch groups of the same ranks).

Parallelism: the MoE layers are Parm's (experts over EP, each expert's hidden dim over ESP,
under the schedule chosen). Everything else (embeddings, attention, dense FFNs, the gate
weight) is replicated on every rank, including over the MP group: the ranks of an MP group
see the same batch and compute the same dense part (no tensor parallelism here); the MP
groups are the data-parallel replicas. Gradients: the replicated parameters' (the dense
part and the gate weights) are averaged over the dp group by DDP (MP-group members hold
equal ones, so that is the mean over the MP groups); the expert shards are left out of DDP
(their gradients differ by shard) and summed over their EDP replicas
(torch.distributed.all_reduce(grad, group=parm.group("edp"))), divided by the number of MP
groups, so every step is that of the mean loss over the MP groups' batches.

Rank 0 prints the loss every --log-every steps. --check: exit 1 unless the mean loss of the
last 5 steps is below that of the first 5, and unless DDP's communication hook saw every
dense gradient element every step and left them equal over dp (CTest runs it so).
"""
import argparse
import math
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import parm
import parm.launch
import parm.torch


def kjv_bytes():
    """The King James text as bytes (the `bible` command of Debian's bible-kjv)."""
    text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True,
                          check=False).stdout
    if len(text) < 1_000_000:
        sys.exit("torch_gpt2_moe: needs Debian's bible-kjv (scripts/install-deps)")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


class Block(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ffn = ffn

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ffn(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        d = a.model_dim
        self.tok, self.pos = nn.Embedding(256, d), nn.Embedding(a.seq_len, d)
        blocks = []
        for i in range(a.layers):
            if i % 2 == 1:  # every second FFN is an MoE layer
                ffn = parm.torch.MoE(d, a.expert_hidden, a.experts, topk=a.topk,
                                     capacity_factor=a.capacity_factor, schedule=a.schedule,
                                     fuse="on", seed=i)
            else:
                ffn = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"),
                                    nn.Linear(4 * d, d))
            blocks.append(Block(d, a.heads, ffn))
        self.blocks = nn.ModuleList(blocks)
        self.ln = nn.LayerNorm(d)
        for emb in (self.tok, self.pos):  # GPT-2's initial scale
            nn.init.normal_(emb.weight, std=0.02)

    def moe_layers(self):
        return [b.ffn for b in self.blocks if isinstance(b.ffn, parm.torch.MoE)]

    def forward(self, idx):
        L = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(L))
        mask = torch.triu(torch.full((L, L), float("-inf")), diagonal=1)
        for b in self.blocks:
            x = b(x, mask)
        return self.ln(x) @ self.tok.weight.t()  # tied output embedding


def expert_shards(model):
    """(name, parameter) of the MoE layers' expert shards (all but the gate weight)."""
    return [(f"{n}", p) for n, p in model.named_parameters()
            if ".ffn." in n and n.rsplit(".", 1)[1] in ("w1", "b1", "w2", "b2")
            and isinstance(model.get_submodule(n.rsplit(".", 1)[0]), parm.torch.MoE)]


def torch_group(name):
    """The torch group of this rank's Parm group `name`: Parm's own under the torch backend;
    under MPI, a torch group of the same ranks (dist.new_group is collective: every rank
    makes every group of that kind)."""
    if parm.backend() == "torch":
        return parm.group(name)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, parm.group_ranks(name))
    mine = None
    for ranks in sorted(set(map(tuple, everyone))):
        g = dist.new_group(list(ranks))
        if dist.get_rank() in ranks:
            mine = g
    return mine


def reduce_expert_grads(shards, edp, groups):
    """The expert shards' gradients summed over their EDP replicas, over the MP groups."""
    params = [p for _, p in shards if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=edp)
    flat.div_(groups)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()


class HookCount:
    """DDP's communication hook state: the stock allreduce hook (average over the group),
    counting the gradient elements it reduces."""

    def __init__(self, group):
        self.group = group
        self.elements = 0


def counting_allreduce_hook(state, bucket):
    state.elements += bucket.buffer().numel()
    return default_hooks.allreduce_hook(state.group, bucket)


def dense_equal_over(model, shards, dp):
    """True when every dense gradient is the same on every rank of dp (what DDP's average
    leaves): each rank's checksum against the group's max and min."""
    sums = torch.stack([p.grad.double().sum() for n, p in model.named_parameters()
                        if n not in shards and p.grad is not None])
    hi, lo = sums.clone(), sums.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=dp)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=dp)
    return bool(torch.equal(hi, lo))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--esp", type=int, default=1)
    ap.add_argument("--schedule", default="s2", choices=["baseline", "s1", "s2"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8, help="sequences per MP group per step")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--model-dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--expert-hidden", type=int, default=128)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--capacity-factor", default="1.25")
    ap.add_argument("--aux-coeff", type=float, default=0.01)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--backend", default="auto", choices=["auto", "torch", "mpi"],
                    help="parm.init's backend (auto: torch.distributed's groups)")
    a = ap.parse_args()

    parm.launch.init_process_group("gloo")
    parm.init(mp=a.mp, ep=a.ep, esp=a.esp, backend=a.backend)
    root = parm.rank() == 0
    groups = parm.world_size() // a.mp
    torch.manual_seed(0)  # the same replicated parameters on every rank
    model = GPT(a)
    shards = expert_shards(model)
    # DDP reduces the dense part over dp; the expert shards are Parm's (reduced over edp).
    DDP._set_params_and_buffers_to_ignore_for_model(model, [n for n, _ in shards])
    dp, edp = torch_group("dp"), torch_group("edp")
    ddp = DDP(model, process_group=dp)
    hook = HookCount(dp)
    ddp.register_comm_hook(hook, counting_allreduce_hook)
    dense_elements = sum(p.numel() for n, p in model.named_parameters()
                         if n not in dict(shards))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    data = kjv_bytes()
    gen = torch.Generator().manual_seed(1 + parm.rank() // a.mp)  # one stream per MP group
    losses, ddp_ok = [], True
    if root:
        print(f"# parm backend {parm.backend()}, layout {parm.layout()}, DDP over dp "
              f"{parm.group_ranks('dp')}, experts over edp {parm.group_ranks('edp')}",
              flush=True)
    for step in range(a.steps):
        starts = torch.randint(0, len(data) - a.seq_len - 1, (a.batch,), generator=gen)
        seq = torch.stack([data[s:s + a.seq_len + 1] for s in starts.tolist()])
        logits = ddp(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), seq[:, 1:].reshape(-1))
        aux = sum(m.l_aux for m in model.moe_layers())
        opt.zero_grad()
        hook.elements = 0
        (loss + a.aux_coeff * aux).backward()  # DDP's allreduce of the dense gradients
        ddp_ok &= hook.elements == dense_elements
        reduce_expert_grads(shards, edp, groups)
        if a.check and step == 0:
            ddp_ok &= dense_equal_over(model, dict(shards), dp)
        opt.step()
        mean = loss.detach().reshape(1).clone()
        dist.all_reduce(mean)
        mean = mean.item() / dist.get_world_size()
        losses.append(mean)
        if root and (step % a.log_every == 0 or step == a.steps - 1):
            print(f"step {step:4d}  loss {mean:.4f}  l_aux {float(aux):.4f}  "
                  f"(bits/byte {mean / math.log(2):.3f})", flush=True)
    if a.check:
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        ok = torch.tensor([float(ddp_ok)])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if root:
            print(f"loss: first 5 steps {first:.4f}, last 5 {last:.4f}; DDP reduced "
                  f"{dense_elements} dense gradient elements per step over dp, equal over dp: "
                  f"{bool(ok.item())}", flush=True)
        sys.exit(0 if last < first and ok.item() == 1.0 else 1)


if __name__ == "__main__":
    main()
