#!/usr/bin/env python3
"""A small GPT-2 in plain PyTorch whose FFN blocks alternate with parm.torch.MoE, trained on
the King James Bible (Debian's bible-kjv, byte-level tokens) with a stock torch optimizer.

    mpirun -np 4 /usr/bin/python3 examples/torch_gpt2_moe.py --ep 2 --esp 2
    (this machine: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
     mpirun -np 4 --oversubscribe --bind-to none /usr/bin/python3 examples/torch_gpt2_moe.py
     --ep 2 --esp 2; with the package not installed, PYTHONPATH=build/python)

Parallelism: the MoE layers are Parm's (experts over EP, each expert's hidden dim over ESP,
under the schedule chosen). Everything else (embeddings, attention, dense FFNs, the gate
weight) is replicated on every rank, including over the MP group: the ranks of an MP group
see the same batch and compute the same dense part (no tensor parallelism here); the MP
groups are the data-parallel replicas. Gradients: the replicated parameters' are averaged over
the world (MP-group members hold equal ones), the expert shards' summed over their EDP
replicas, both divided by the number of MP groups, so every step is that of the mean loss
over the MP groups' batches.

Rank 0 prints the loss every --log-every steps. --check: exit 1 unless the mean loss of the
last 5 steps is below that of the first 5 (CTest runs it so).
"""
import argparse
import math
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import parm
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


def average_grads(model, groups):
    """The replicated parameters' gradients averaged over the world; the expert shards'
    summed over their EDP replicas and divided by the number of MP groups."""
    shards = {id(m.w1) for m in model.moe_layers()} | {id(m.b1) for m in model.moe_layers()} \
        | {id(m.w2) for m in model.moe_layers()} | {id(m.b2) for m in model.moe_layers()}
    for group, pick, scale in (("world", lambda p: id(p) not in shards, 1 / parm.world_size()),
                               ("edp", lambda p: id(p) in shards, 1 / groups)):
        params = [p for p in model.parameters() if pick(p) and p.grad is not None]
        if not params:
            continue
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        parm.allreduce_sum(flat, group).mul_(scale)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()


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
    a = ap.parse_args()

    parm.init(mp=a.mp, ep=a.ep, esp=a.esp)
    root = parm.rank() == 0
    groups = parm.world_size() // a.mp
    torch.manual_seed(0)  # the same replicated parameters on every rank
    model = GPT(a)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    data = kjv_bytes()
    gen = torch.Generator().manual_seed(1 + parm.rank() // a.mp)  # one stream per MP group
    losses = []
    for step in range(a.steps):
        starts = torch.randint(0, len(data) - a.seq_len - 1, (a.batch,), generator=gen)
        seq = torch.stack([data[s:s + a.seq_len + 1] for s in starts.tolist()])
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), seq[:, 1:].reshape(-1))
        aux = sum(m.l_aux for m in model.moe_layers())
        opt.zero_grad()
        (loss + a.aux_coeff * aux).backward()
        average_grads(model, groups)
        opt.step()
        mean = parm.allreduce_sum(loss.detach().reshape(1).clone()).item() / parm.world_size()
        losses.append(mean)
        if root and (step % a.log_every == 0 or step == a.steps - 1):
            print(f"step {step:4d}  loss {mean:.4f}  l_aux {float(aux):.4f}  "
                  f"(bits/byte {mean / math.log(2):.3f})", flush=True)
    if a.check:
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        if root:
            print(f"loss: first 5 steps {first:.4f}, last 5 {last:.4f}", flush=True)
        sys.exit(0 if last < first else 1)


if __name__ == "__main__":
    main()
