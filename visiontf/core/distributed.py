"""The one set of distributed helpers: this process's rank and the number of processes.

Inside an initialised ``torch.distributed`` group they come from it. Outside one, the world size
is 1 (collectives must not run), while the rank still follows the launcher's environment, which
DataLoader workers of a DDP process need: torchrun and Lightning set ``RANK``, SLURM ``SLURM_PROCID``.
"""
from __future__ import annotations

import os

import torch.distributed as dist

_RANK_VARS = ("RANK", "GLOBAL_RANK", "SLURM_PROCID", "LOCAL_RANK")


def is_distributed() -> bool:
    """True inside an initialised process group."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """This process's global rank: the process group's, else the launcher's environment, else 0."""
    if is_distributed():
        return dist.get_rank()
    return _from_env(_RANK_VARS, 0)


def sum_over_ranks(tensor):
    """``tensor`` summed in place over the processes of the group (unchanged without one), and returned."""
    if is_distributed():
        dist.all_reduce(tensor)
    return tensor


def get_world_size() -> int:
    """How many processes take part in the initialised process group; 1 without one."""
    return dist.get_world_size() if is_distributed() else 1


def _from_env(names: tuple[str, ...], default: int) -> int:
    for var in names:
        value = os.environ.get(var)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return default


__all__ = ["get_rank", "get_world_size", "is_distributed"]
