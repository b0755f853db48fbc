"""Parm: the Mixture-of-Experts layer and its schedules (docs/spec.md) from Python.

Run a script under MPI (``mpirun -np N /usr/bin/python3 script.py``), call ``parm.init``
once, then build ``parm.torch.MoE`` layers::

    import parm, parm.torch
    parm.init(mp=1, ep=2, esp=1)
    moe = parm.torch.MoE(model_dim=512, hidden=2048, experts=8, schedule="s2")
    y = moe(x)                        # x: (T, M) or (B, L, M) float32
    loss = task_loss(y) + 0.01 * moe.l_aux

Parm's errors arrive as Python exceptions: an invalid configuration or layout raises
ValueError, a watchdog timeout parm.TimeoutError, any other failure RuntimeError, each with
Parm's message. Everything but ``init`` raises RuntimeError before ``parm.init``. A script
that ends on an uncaught exception, or after a collective failed (timed out), ends the whole
job at exit (MPI_Abort, exit code 1), so no other rank waits for it.
"""
import atexit
import sys

from . import _core

TimeoutError = _core.TimeoutError  # a subclass of the built-in TimeoutError

__all__ = ["init", "rank", "world_size", "group_ranks", "group_rank", "layout", "device",
           "initialized", "allreduce_sum", "TimeoutError"]


def init(mp=1, ep=1, esp=1, ranks_per_node=None, device="cpu", timeout=300, pp=1, order=None):
    """Starts MPI (first call) and builds the topology of this job over every rank:
    N_MP = mp for the dense part, N_EP = ep and N_ESP = esp for the experts (docs/spec.md §1),
    pp pipeline stages (`--pp`; a layer built here runs inside this rank's stage), the
    groups nested as `order` says (`--order`: "mp", "esp", "ep", "dp", "pp" joined by "-",
    innermost first; None: "mp-esp-ep-dp-pp"; docs/layout.md). Collective: every rank calls
    it with the same values. A later call replaces the topology for the layers built after
    it. ranks_per_node: emulate nodes of that many ranks (None: the real nodes). timeout:
    seconds every operation may take before parm.TimeoutError."""
    for name, v in (("mp", mp), ("ep", ep), ("esp", esp), ("pp", pp)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"parm.init: {name} must be an int, got {v!r}")
    if order is None:
        order = _core.DEFAULT_ORDER
    if not isinstance(order, str):
        raise ValueError(f"parm.init: order must be None or a str such as "
                         f"{_core.DEFAULT_ORDER!r}, got {order!r}")
    if ranks_per_node is not None and (not isinstance(ranks_per_node, int) or ranks_per_node < 1):
        raise ValueError(f"parm.init: ranks_per_node must be None or an int >= 1, got {ranks_per_node!r}")
    if device == "cuda":
        import torch  # the layer's tensors are torch's: its CUDA must be there too

        if not torch.cuda.is_available():
            raise ValueError("parm.init(device='cuda'): this torch has no usable CUDA "
                             "(torch.cuda.is_available() is False); use device='cpu'")
    _core.init(mp, ep, esp, pp, order, 0 if ranks_per_node is None else ranks_per_node,
               str(device), float(timeout))
    global _cuda_stream
    _cuda_stream = None
    if _core.device() == "cuda":
        # torch's "cuda" is then this rank's GPU, and tensors cross on Parm's stream.
        _cuda_stream = _core.cuda_stream()
        torch.cuda.set_device(_core.cuda_device())


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
