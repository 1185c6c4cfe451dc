"""The one set of distributed helpers: this process's rank and the number of processes.

Inside an initialised ``torch.distributed`` group they come from it. Before that (DataLoader
workers, code run while Lightning is still launching) the launcher's environment variables tell:
torchrun and Lightning set ``RANK``/``WORLD_SIZE``, SLURM ``SLURM_PROCID``/``SLURM_NTASKS``.
"""
from __future__ import annotations

import os

import torch.distributed as dist

_RANK_VARS = ("RANK", "GLOBAL_RANK", "SLURM_PROCID", "LOCAL_RANK")
_WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS")


def is_distributed() -> bool:
    """True inside an initialised process group."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """This process's global rank: the process group's, else the launcher's environment, else 0."""
    if is_distributed():
        return dist.get_rank()
    return _from_env(_RANK_VARS, 0)


def get_world_size() -> int:
    """How many processes take part: the process group's size, else the launcher's environment, else 1."""
    if is_distributed():
        return dist.get_world_size()
    return _from_env(_WORLD_VARS, 1)


def _from_env(names: tuple[str, ...], default: int) -> int:
    for var in names:
        value = os.environ.get(var)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return default


__all__ = ["get_rank", "get_world_size", "is_distributed"]
