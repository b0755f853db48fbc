"""Parm: the Mixture-of-Experts layer and its schedules (docs/spec.md) from Python.

Launch a script as any PyTorch one (``torchrun``: on Debian ``scripts/torchrun``;
``parm.launch.spawn``; or ``mpirun -np N /usr/bin/python3 script.py``), call ``parm.init``
once, then build ``parm.torch.MoE`` layers::

    import parm, parm.launch, parm.torch
    parm.launch.init_process_group()   # torch.distributed (or the caller's own)
    parm.init(mp=1, ep=2, esp=1)       # over torch's groups; without torch.distributed: MPI
    moe = parm.torch.MoE(model_dim=512, hidden=2048, experts=8, schedule="s2")
    y = moe(x)                        # x: (T, M) or (B, L, M) float32
    loss = task_loss(y) + 0.01 * moe.l_aux

Parm's errors arrive as Python exceptions: an invalid configuration or layout raises
ValueError, a watchdog timeout parm.TimeoutError, any other failure RuntimeError, each with
Parm's message. Everything but ``init`` raises RuntimeError before ``parm.init``. A script
that ends on an uncaught exception, or after a collective failed (timed out), ends the whole
job at exit (MPI_Abort, exit code 1; over torch.distributed, exit code 1 without teardown,
and the launcher stops the other ranks), so no other rank waits for it. docs/torch.md.
"""
import atexit
import os
import sys

from . import _core

TimeoutError = _core.TimeoutError  # a subclass of the built-in TimeoutError

__all__ = ["init", "backend", "group", "rank", "world_size", "group_ranks", "group_rank",
           "layout", "device",
           "initialized", "allreduce_sum", "TimeoutError"]


def init(mp=1, ep=1, esp=1, ranks_per_node=None, device="cpu", timeout=300, pp=1, order=None,
         backend="auto", process_groups=None):
    """Builds the topology of this job over every rank: N_MP = mp for the dense part, N_EP =
    ep and N_ESP = esp for the experts (docs/spec.md §1), pp pipeline stages (`--pp`; a layer
    built here runs inside this rank's stage), the groups nested as `order` says (`--order`:
    "mp", "esp", "ep", "dp", "pp" joined by "-", innermost first; None: "mp-esp-ep-dp-pp";
    docs/layout.md). Collective: every rank calls it with the same values. A later call
    replaces the topology for the layers built after it. ranks_per_node: emulate nodes of
    that many ranks (None: the real nodes). timeout: seconds every operation may take before
    parm.TimeoutError.

    backend: "mpi" (Parm's MPI world; starts MPI on the first call: run under mpirun),
    "torch" (torch.distributed's groups, which must be initialized: torchrun,
    torch.multiprocessing.spawn, or mpirun with init_process_group; no MPI call is made), or
    "auto": "torch" whenever torch.distributed.is_initialized(), else "mpi".
    process_groups (backend "torch"): the caller's own groups, {"mp": g, "ep": g, "esp": g,
    "dp": g, "edp": g} (any of them); Parm checks on every rank that they form a valid layout
    of these sizes (with `order`, or the first order they fit when order is None) and refuses
    them otherwise, naming the group and what would be valid, before any work; the groups
    not given are created with torch.distributed.new_group. docs/torch.md."""
    for name, v in (("mp", mp), ("ep", ep), ("esp", esp), ("pp", pp)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"parm.init: {name} must be an int, got {v!r}")
    if order is not None and not isinstance(order, str):
        raise ValueError(f"parm.init: order must be None or a str such as "
                         f"{_core.DEFAULT_ORDER!r}, got {order!r}")
    if ranks_per_node is not None and (not isinstance(ranks_per_node, int) or ranks_per_node < 1):
        raise ValueError(f"parm.init: ranks_per_node must be None or an int >= 1, got {ranks_per_node!r}")
    if backend not in ("auto", "mpi", "torch"):
        raise ValueError(f"parm.init: backend {backend!r}; valid values are 'auto', 'mpi', "
                         f"'torch'")
    if backend == "auto":
        backend = "torch" if _torch_distributed_initialized() else "mpi"
        launched = os.environ.get("WORLD_SIZE", "1")
        if (backend == "mpi" and launched.isdigit() and int(launched) > 1
                and "OMPI_COMM_WORLD_SIZE" not in os.environ):
            # torchrun (or spawn) started WORLD_SIZE ranks: MPI would make each a job of one.
            raise ValueError(
                f"parm.init: launched as one of WORLD_SIZE={launched} ranks (torchrun?) but "
                f"torch.distributed is not initialized; call "
                f"torch.distributed.init_process_group (or parm.launch.init_process_group()) "
                f"before parm.init, or launch with mpirun for backend='mpi'")
    if process_groups is not None and backend != "torch":
        raise ValueError("parm.init: process_groups are torch.distributed groups and need "
                         "backend='torch' (or 'auto' with torch.distributed initialized)")
    if process_groups is not None and not isinstance(process_groups, dict):
        raise ValueError(f"parm.init: process_groups must be a dict such as "
                         f"{{'ep': group, 'edp': group}}, got {type(process_groups).__name__}")
    if device == "cuda":
        import torch  # the layer's tensors are torch's: its CUDA must be there too

        if not torch.cuda.is_available():
            raise ValueError("parm.init(device='cuda'): this torch has no usable CUDA "
                             "(torch.cuda.is_available() is False); use device='cpu'")
    global _cuda_stream, _torch_groups
    if backend == "torch":
        from . import _torch_backend

        _core.check_device_name(str(device))
        if ranks_per_node is not None:
            raise ValueError("parm.init(backend='torch'): ranks_per_node emulates nodes of an "
                             "MPI job; the torch backend takes the nodes from the host names")
        _torch_groups = _torch_backend.build(mp, ep, esp, pp, order, timeout, process_groups,
                                             str(device))
    else:
        _core.init(mp, ep, esp, pp, order or _core.DEFAULT_ORDER,
                   0 if ranks_per_node is None else ranks_per_node, str(device), float(timeout))
        _torch_groups = None
    _cuda_stream = None
    if _core.device() == "cuda":
        # torch's "cuda" is then this rank's GPU, and tensors cross on Parm's stream.
        _cuda_stream = _core.cuda_stream()
        torch.cuda.set_device(_core.cuda_device())


def _torch_distributed_initialized():
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


_torch_groups = None  # backend "torch": {group name: the torch process group Parm uses}


def backend():
    """Which communicator runs Parm's collectives: "mpi", "torch" (torch.distributed's
    groups) or "nccl" (device="cuda" over NCCL)."""
    return _core.comm_backend()


def group(name):
    """The torch.distributed process group Parm uses for its group `name` ("world", "dp",
    "mp", "ep", "esp", "edp", "pp") on this rank, so that the caller reduces over the same
    groups (torch.distributed.all_reduce(p.grad, group=parm.group("edp"))). backend "torch"
    only (under "mpi" Parm's groups are MPI communicators: use parm.allreduce_sum)."""
    if not _core.initialized():
        raise RuntimeError(f"parm.group({name!r}) before parm.init(): call parm.init first")
    if _torch_groups is None:
        raise RuntimeError(f"parm.group({name!r}): Parm runs over {backend()!r}, not torch "
                           f"groups; use parm.allreduce_sum(tensor, {name!r}), or "
                           f"parm.init(backend='torch')")
    if name not in _torch_groups:
        raise ValueError(f"parm.group({name!r}): valid names are "
                         f"{', '.join(_torch_groups)}")
    return _torch_groups[name]


_cuda_stream = None  # Parm's compute stream (an int, DLPack's convention) under device="cuda"


def _dlpack(tensor, what, op):
    """tensor's DLPack capsule for parm._core, which checks it (dtype, device, contiguity,
    shape) and uses its memory in place: borrowed, tensor keeps owning the memory. A CUDA
    tensor is exported for Parm's compute stream, so that stream first waits for the work
    torch queued on the tensor (the DLPack stream protocol of tensor.__dlpack__)."""
    import torch  # parm itself runs without torch; tensors are torch's

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {what} must be a torch.Tensor, got {type(tensor).__name__}")
    stream = _cuda_stream if tensor.device.type == "cuda" else None
    try:
        return tensor.detach().__dlpack__(stream)
    except (RuntimeError, TypeError) as e:  # sparse layouts, conjugate bit, ...
        raise ValueError(f"{op}: {what} cannot be shared with Parm: {e}") from None


def initialized():
    """True once parm.init succeeded."""
    return _core.initialized()


def rank():
    """This process's rank in the job."""
    return _core.rank()


def world_size():
    """The number of ranks in the job."""
    return _core.world_size()


def group_ranks(group):
    """World ranks of this rank's group `group` ("world", "dp", "mp", "ep", "esp", "edp",
    "pp"), in group-rank order."""
    return _core.group_ranks(group)


def group_rank(group):
    """This rank's position in its group `group`."""
    return _core.group_rank(group)


def layout():
    """The sizes of every dimension and their nesting: {"world", "mp", "ep", "esp", "dp",
    "edp", "pp"} (ints) and "order" (the groups innermost first, e.g. "mp-esp-ep-dp-pp")."""
    return _core.layout()


def allreduce_sum(tensor, group="world"):
    """Sums a contiguous float32 CPU torch tensor over this rank's group `group` in place
    (Parm's host communicator of that group, with its watchdog): what data-parallel training
    needs for the gradients (dense ones over "world" or "dp", expert shards over "edp").
    Collective over the group. Anything else is refused with ValueError."""
    _core.allreduce_sum(_dlpack(tensor, "the tensor", "parm.allreduce_sum"), group)
    return tensor


def device():
    """The device the layers compute on: "cpu" or "cuda"."""
    return _core.device()


_uncaught = False  # the script is ending on an uncaught exception


def _note_uncaught(kind, value, tb, _previous=sys.excepthook):
    global _uncaught
    _uncaught = True
    _previous(kind, value, tb)


def _at_exit():
    # After an uncaught exception or a failed collective the other ranks may be waiting for
    # this one: MPI_Abort ends the whole job (exit code 1) instead of leaving them to hang.
    sys.stdout.flush()
    sys.stderr.flush()
    _core.finalize(abort=_uncaught)


sys.excepthook = _note_uncaught
atexit.register(_at_exit)
