"""parm.init(backend="torch"): Parm's groups over torch.distributed (docs/torch.md).

Group wraps one torch process group for parm._core (python/torch_group.cpp): every
operation of Parm's Communicator (include/parm/comm.h) is issued as torch.distributed's
asynchronous call on the caller's buffers, borrowed in place (DLPack tensors over Parm's
memory: no copy), and returns a Work that Parm's C++ waits for with its deadline. The
orders of float sums, the counters and the deadline are Parm's (src/comm/
external_communicator.h). Also here: building Parm's groups over torch's world, and
checking the caller's own groups against a Parm layout before any work.
"""
import atexit
import collections
import ctypes
import datetime
import itertools
import socket
import time

import torch
import torch.distributed as dist
import torch.utils.dlpack

from . import _core

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
GROUPS = ("world", "dp", "mp", "ep", "esp", "edp", "pp")
# Groups a caller may hand in (world is torch's own; pp is Parm's pipeline dimension, 1 here).
CALLER_GROUPS = ("mp", "ep", "esp", "dp", "edp")


def _t(capsule):
    return torch.utils.dlpack.from_dlpack(capsule)


# The last operations to finish, each its torch work handle and tensors. torch.distributed's
# worker thread (gloo's runLoop) drops its own reference to an operation a moment after
# marking it complete; were Python's the last reference to go first, that thread would free
# the tensors' Python objects, taking the GIL, and during interpreter shutdown that ends the
# process (std::terminate from pthread_exit). Held here, the tensors are freed by Python, on
# the thread that drops them; at exit they are kept for good (_keep_retired_forever).
_RETIRED = collections.deque(maxlen=8)


def _retire(work, keep):
    if work is not None or keep:
        _RETIRED.append((work, keep))


@atexit.register
def _keep_retired_forever():
    # One more reference that nothing drops: the interpreter's teardown never frees these.
    held = list(_RETIRED)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))


class Work:
    """One operation in flight: torch's work handle, the tensors it uses (kept alive until
    it completes) and what must run after it (copies out of a staging tensor)."""

    __slots__ = ("work", "keep", "after")

    def __init__(self, work, keep=(), after=None):
        self.work, self.keep, self.after = work, keep, after

    def _finish(self):
        if self.after is not None:
            self.after()
            self.after = None
        _retire(self.work, self.keep)
        self.work, self.keep = None, ()

    def done(self):
        if self.work is not None and not self.work.is_completed():
            return False
        if self.work is not None and not self.work.is_success():
            raise RuntimeError(str(self.work.exception()))
        self._finish()
        return True

    def wait(self, seconds):
        """True once complete; False when `seconds` ran out first (torch's wait raises then;
        an error raised before the time ran out is the library's, and propagates)."""
        if self.work is not None:
            start = time.monotonic()
            try:
                self.work.wait(datetime.timedelta(seconds=seconds))
            except RuntimeError:
                if time.monotonic() - start >= 0.95 * seconds:
                    return False
                raise
        self._finish()
        return True


class Group:
    """One of Parm's groups over the torch process group `pg` whose members are the global
    ranks `ranks` in group-rank order."""

    def __init__(self, pg, ranks):
        self.pg = pg
        self.ranks = list(ranks)
        self.size = len(self.ranks)
        self.rank = self.ranks.index(dist.get_rank())

    def allreduce(self, buf, op):
        t = _t(buf)
        return Work(dist.all_reduce(t, op=_OPS[op], group=self.pg, async_op=True), (t,))

    def allgather(self, send, recv):
        s, r = _t(send), _t(recv)
        n = s.numel()
        if n == 0:
            return Work(None)
        outs = list(r.split(n))
        return Work(dist.all_gather(outs, s, group=self.pg, async_op=True), (s, r, outs))

    def alltoall(self, send, recv):
        s, r = _t(send), _t(recv)
        if s.numel() == 0:
            return Work(None)
        return Work(dist.all_to_all_single(r, s, group=self.pg, async_op=True), (s, r))

    def alltoallv(self, send, sc, sd, recv, rc, rd):
        s, r = _t(send), _t(recv)
        if sum(sc) == 0 and sum(rc) == 0:
            return Work(None)
        # torch's all_to_all_single takes the blocks packed in peer order: used in place when
        # they are, staged otherwise.
        packed = (list(sd) == list(itertools.accumulate([0] + list(sc[:-1]))) and
                  list(rd) == list(itertools.accumulate([0] + list(rc[:-1]))))
        if packed:
            s_use, r_use, after = s[:sum(sc)], r[:sum(rc)], None
        else:
            s_use = torch.cat([s[d:d + c] for c, d in zip(sc, sd)])
            r_use = torch.empty(sum(rc), dtype=r.dtype)

            def after():
                o = 0
                for c, d in zip(rc, rd):
                    r[d:d + c].copy_(r_use[o:o + c])
                    o += c
        w = dist.all_to_all_single(r_use, s_use, output_split_sizes=list(rc),
                                   input_split_sizes=list(sc), group=self.pg, async_op=True)
        return Work(w, (s, r, s_use, r_use), after)

    def send(self, buf, peer, tag):
        t = _t(buf)
        return Work(dist.isend(t, self.ranks[peer], group=self.pg, tag=tag), (t,))

    def recv(self, buf, peer, tag):
        t = _t(buf)
        return Work(dist.irecv(t, self.ranks[peer], group=self.pg, tag=tag), (t,))

    def broadcast(self, buf, root):
        t = _t(buf)
        return Work(dist.broadcast(t, self.ranks[root], group=self.pg, async_op=True), (t,))

    def barrier(self):
        return Work(dist.barrier(group=self.pg, async_op=True))


def group_ranks_of(pg):
    """The global ranks of torch group `pg` in group-rank order (None: the world)."""
    if pg is None or pg is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    from torch.distributed import distributed_c10d as c10d

    if hasattr(dist, "get_process_group_ranks"):
        return list(dist.get_process_group_ranks(pg))
    ranks = c10d._pg_group_ranks.get(pg)
    if ranks is None:
        raise ValueError(f"parm.init: {pg!r} is not a torch.distributed process group of this "
                         f"job")
    return [g for g, _ in sorted(ranks.items(), key=lambda kv: kv[1])]


# The groups Parm made, by (member ranks, backend): a later parm.init reuses them, as every
# torch group holds threads and connections for as long as the job runs (torch never frees
# one). Every rank makes the same groups in the same order, so every rank's cache is alike.
_made = {}


def _new_group(ranks, backend=None):
    if _made.get("world") is not dist.group.WORLD:  # torch's world was made anew
        _made.clear()
        _made["world"] = dist.group.WORLD
    key = (tuple(ranks), backend)
    if key not in _made:
        _made[key] = dist.new_group(list(ranks), backend=backend)
    return _made[key]


def _orders():
    """Every nesting of the groups, innermost first (the default first)."""
    default = _core.DEFAULT_ORDER
    yield default
    for p in itertools.permutations(default.split("-")):
        o = "-".join(p)
        if o != default:
            yield o


def _layout_members(mp, ep, esp, pp, order):
    """{group: [members of every world rank's group]} of the layout, or None when the layout
    or order is not valid."""
    world = dist.get_world_size()
    try:
        return {g: _core.layout_members(world, mp, ep, esp, pp, order, g) for g in GROUPS}
    except ValueError:
        return None


def _describe(members):
    """The distinct groups of a list of every rank's members, e.g. [[0, 1], [2, 3]]."""
    seen = []
    for m in members:
        if m not in seen:
            seen.append(m)
    return seen


def build(mp, ep, esp, pp, order, timeout, process_groups, device="cpu"):
    """Checks the caller's groups (every rank sees every rank's: the same verdict
    everywhere, before any work), creates the missing ones with dist.new_group, and builds
    Parm's topology over them. Returns {name: torch group} of Parm's groups."""
    if not dist.is_initialized():
        raise ValueError("parm.init(backend='torch'): torch.distributed is not initialized; "
                         "call torch.distributed.init_process_group first (torchrun sets "
                         "its variables), or use backend='mpi' under mpirun")
    world, rank = dist.get_world_size(), dist.get_rank()
    given = dict(process_groups or {})
    for name in given:
        if name not in CALLER_GROUPS:
            raise ValueError(f"parm.init: process_groups has {name!r}; valid keys are "
                             f"{', '.join(CALLER_GROUPS)}")
    # Every rank's groups, host name and complaint, so that every rank decides alike (a rank
    # refusing alone would leave the others waiting for it).
    mine, problem = {}, None
    try:
        mine = {name: group_ranks_of(pg) for name, pg in given.items()}
        for name, ranks in mine.items():
            if rank not in ranks:
                problem = (f"process_groups[{name!r}] of rank {rank} is {ranks}, which does "
                           f"not hold rank {rank}")
    except ValueError as e:
        problem = str(e)
    everyone = [None] * world
    dist.all_gather_object(everyone, {"groups": mine, "host": socket.gethostname(),
                                      "problem": problem, "keys": sorted(given)})
    for r, theirs in enumerate(everyone):
        if theirs["problem"] is not None:
            raise ValueError(f"parm.init: {theirs['problem']} (rank {r})")
    names = sorted(given)
    for r, theirs in enumerate(everyone):
        if theirs["keys"] != names:
            raise ValueError(f"parm.init: rank {rank} passed process_groups "
                             f"{names} but rank {r} passed {theirs['keys']}; every "
                             f"rank must pass the same keys")
    for name in names:  # a member of my group must see the same group: else they overlap
        for r, theirs in enumerate(everyone):
            for q in theirs["groups"][name]:
                other = everyone[q]["groups"][name]
                if other != theirs["groups"][name]:
                    raise ValueError(
                        f"parm.init: process_groups[{name!r}] overlap: rank {r}'s is "
                        f"{theirs['groups'][name]} but rank {q}'s is {other}; each rank must "
                        f"be in exactly one {name} group, the same on all its members")
    sizes = {"mp": mp, "ep": ep, "esp": esp}
    for name in names:
        got = len(mine[name])
        if name in sizes and got != sizes[name]:
            raise ValueError(f"parm.init: process_groups[{name!r}] has {got} ranks but "
                             f"{name}={sizes[name]}; pass {name}={got} or a group of "
                             f"{sizes[name]} ranks")
    # An invalid layout (or order) is refused with Parm's own message.
    _core.layout_members(world, mp, ep, esp, pp, order or _core.DEFAULT_ORDER, "world")
    candidates = [order] if order is not None else list(_orders())
    chosen, first_mismatch = None, None
    for o in candidates:
        members = _layout_members(mp, ep, esp, pp, o)
        if members is None:
            continue
        bad = None
        for name in names:
            for r, theirs in enumerate(everyone):
                if theirs["groups"][name] != members[name][r]:
                    bad = (name, r, theirs["groups"][name], members[name])
                    break
            if bad:
                break
        if bad is None:
            chosen = o
            break
        if first_mismatch is None:
            first_mismatch = (o, bad)
    if chosen is None:
        o, (name, r, got, want) = first_mismatch
        callers = _describe([e["groups"][name] for e in everyone])
        raise ValueError(
            f"parm.init: process_groups[{name!r}] of rank {r} is {got}, which no Parm layout "
            f"of world {world} with mp {mp} ep {ep} esp {esp} has (the caller's {name} groups: "
            f"{callers}; with order {o!r} they would be {_describe(want)}; docs/layout.md); "
            f"every rank must be in exactly one group of each kind, the groups nested as an "
            f"order says")
    members = _layout_members(mp, ep, esp, pp, chosen)
    # Parm's groups: the caller's where given, else new ones (every rank creates every group:
    # dist.new_group is collective over the world).
    pgs = {"world": dist.group.WORLD}
    for name in GROUPS:
        if name == "world":
            continue
        if name in given:
            pgs[name] = given[name]
            continue
        for ranks in _describe(members[name]):
            pg = _new_group(ranks)
            if rank in ranks:
                pgs[name] = pg
    # Parm's host communicators move host memory: over gloo. Where a group is not gloo's (a
    # caller's NCCL groups, an NCCL world), a gloo group of the same ranks stands beside it
    # (every rank makes every such group: new_group is collective over the world); on
    # device="cuda" Parm's NCCL communicators are bootstrapped over these (docs/torch.md).
    host = {}
    for name in GROUPS:
        if dist.get_backend(pgs[name]) == "gloo":
            host[name] = pgs[name]
            continue
        for ranks in _describe(members[name]):
            pg = _new_group(ranks, "gloo")
            if rank in ranks:
                host[name] = pg
    groups = {name: Group(pg, members[name][rank]) for name, pg in host.items()}
    hosts = [e["host"] for e in everyone]
    node_of = [sorted(set(hosts), key=hosts.index).index(h) for h in hosts]
    _core.init_torch(world, mp, ep, esp, pp, chosen, float(timeout), rank, node_of, groups,
                     device)
    return pgs
