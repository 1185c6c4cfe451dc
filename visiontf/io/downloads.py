"""Fail fast, without retries, when ``pretrained=True`` needs a download and there is no network.

timm downloads through the HuggingFace hub client, which retries a failed request five times with
back-off (2, 4, 8, 8 s): offline, ``create_model(..., pretrained=True)`` waited through every retry
before its error. torch hub (the original DETR weights, torchvision's ResNets) does not retry, but a
firewall that drops packets leaves it waiting on a socket without a timeout.

Before a download, :func:`network_problem` says why there is no network, if there is none:

* ``HF_HUB_OFFLINE=1`` / ``TRANSFORMERS_OFFLINE=1`` (HuggingFace's switches; for the hub only) or
  ``VISIONTF_OFFLINE=1`` (every download);
* else a TCP connection to the host, port 443, that does not open within
  :data:`CONNECT_TIMEOUT_S` seconds (DNS failures return at once).

Files already in a cache need no network: torch hub's cache is checked by file name
(:func:`torch_hub_cached`), and the hub client is switched to offline mode (:func:`hf_hub_offline`),
in which it reads its cache and fails at once when the file is not there.
"""
from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from visiontf.core.errors import UserError

#: seconds to wait for a TCP connection before calling the host unreachable
CONNECT_TIMEOUT_S = 3.0
HF_HOST = "huggingface.co"
_TRUE = ("1", "true", "yes", "on")

__all__ = ["CONNECT_TIMEOUT_S", "DownloadError", "check_torch_hub_download", "hf_hub_offline", "network_problem", "reachable",
           "torch_hub_cached"]


class DownloadError(UserError, RuntimeError):
    """Published weights could not be downloaded (offline); the message says how to pass a local file."""


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def reachable(host: str, port: int = 443, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def network_problem(url: str) -> str | None:
    """Why ``url`` cannot be downloaded now (an offline switch, an unreachable host), or None."""
    host = urlparse(url).hostname or url
    if _env_true("VISIONTF_OFFLINE"):
        return "VISIONTF_OFFLINE is set"
    if host.endswith(HF_HOST):
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            if _env_true(name):
                return f"{name} is set"
    if not reachable(host):
        return f"{host} is not reachable (no network?)"
    return None


def torch_hub_cached(url: str) -> bool:
    """Whether torch hub already holds ``url``'s file (``<hub dir>/checkpoints/<file name>``)."""
    import torch

    return (Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name).is_file()


@contextlib.contextmanager
def hf_hub_offline() -> Iterator[None]:
    """The HuggingFace hub client in offline mode: cached files load, missing ones fail at once, no retries."""
    try:
        from huggingface_hub import constants
    except ImportError:  # no hub client: nothing retries
        yield
        return
    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def check_torch_hub_download(url: str, what: str, fix: str) -> None:
    """Raise :class:`DownloadError` at once when ``url`` is not in torch hub's cache and cannot be downloaded now."""
    if torch_hub_cached(url):
        return
    problem = network_problem(url)
    if problem:
        raise DownloadError(f"cannot download {what} from {url}: {problem}. {fix}")
