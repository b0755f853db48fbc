"""Starting torch.distributed for parm.init(backend="torch"), however the script was launched.

    import parm, parm.launch
    parm.launch.init_process_group()       # torchrun, scripts/torchrun, spawn() or mpirun
    parm.init(mp=1, ep=2, esp=1)           # backend "auto": torch.distributed's groups

Launchers (docs/torch.md):
  - ``torchrun --nproc_per_node N script.py``: Debian's torchrun (torch 1.13) crashes on
    Python 3.11 before starting a worker; ``scripts/torchrun`` is the same torchrun with
    that bug fixed, see there.
  - ``spawn(fn, nprocs, args)`` below: torch.multiprocessing.spawn with the variables set.
  - ``mpirun -np N python3 script.py``: the ranks come from Open MPI's variables and meet in
    a file store in /tmp named by the job id (one node), or at MASTER_ADDR:MASTER_PORT when
    those are set (``mpirun -x MASTER_ADDR=host -x MASTER_PORT=port``, any number of nodes).
"""
import datetime
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing


def _env_int(name):
    v = os.environ.get(name)
    return None if v is None else int(v)


def init_process_group(backend="gloo", timeout=1800):
    """torch.distributed.init_process_group from the launcher's variables: RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun, spawn below), or Open MPI's
    OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (mpirun). A no-op when torch.distributed is
    initialized already. timeout: torch's own limit on its store and collectives (Parm's
    operations are bounded by parm.init(timeout=) well before it). Returns (rank, world)."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    td = datetime.timedelta(seconds=timeout)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, timeout=td)  # env://
    elif "OMPI_COMM_WORLD_RANK" in os.environ:
        rank, world = _env_int("OMPI_COMM_WORLD_RANK"), _env_int("OMPI_COMM_WORLD_SIZE")
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                  world, rank == 0, td)
        else:
            job = os.environ.get("OMPI_MCA_ess_base_jobid") or os.environ.get("PMIX_NAMESPACE")
            if job is None:
                raise RuntimeError("parm.launch: under mpirun without the job id variables "
                                   "(OMPI_MCA_ess_base_jobid); set MASTER_ADDR and "
                                   "MASTER_PORT")
            path = os.path.join(tempfile.gettempdir(), f"parm-torch-store-{job}")
            store = dist.FileStore(path, world)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=td)
    else:
        raise RuntimeError(
            "parm.launch.init_process_group: no launcher variables (RANK and WORLD_SIZE, or "
            "Open MPI's OMPI_COMM_WORLD_RANK); launch with scripts/torchrun, torchrun, "
            "parm.launch.spawn or mpirun")
    return dist.get_rank(), dist.get_world_size()


def free_port():
    """A TCP port free on this host now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(local_rank, fn, nprocs, port, args):
    os.environ.update({"RANK": str(local_rank), "WORLD_SIZE": str(nprocs),
                       "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(nprocs),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    fn(local_rank, *args)


def spawn(fn, nprocs, args=()):
    """torch.multiprocessing.spawn(fn, args, nprocs) on this host with the variables torchrun
    sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; OMP_NUM_THREADS 1 unless
    set), so that fn(rank, *args) can call init_process_group() and parm.init. A rank that
    fails ends the others (torch's spawn), and the error is raised here."""
    torch.multiprocessing.spawn(_spawned, args=(fn, nprocs, free_port(), tuple(args)),
                                nprocs=nprocs, join=True)
