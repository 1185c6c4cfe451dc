"""Offline ``pretrained=True`` fails at once with its message, instead of retrying for ~50 s.

No test opens a socket: ``socket.create_connection`` and the download functions are monkeypatched.
"""
import socket
import time

import pytest

import visiontf
import visiontf.models
from visiontf.core.errors import UserError
from visiontf.io import downloads
from visiontf.io.downloads import DownloadError, network_problem, reachable


@pytest.fixture
def no_sockets(monkeypatch):
    """Any connection attempt fails the test; the offline switches are off unless a test sets one."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a socket was opened: {args}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VISIONTF_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("env, url, expected", [
    ("HF_HUB_OFFLINE", "https://huggingface.co", "HF_HUB_OFFLINE is set"),
    ("TRANSFORMERS_OFFLINE", "https://huggingface.co", "TRANSFORMERS_OFFLINE is set"),
    ("VISIONTF_OFFLINE", "https://dl.fbaipublicfiles.com/detr/x.pth", "VISIONTF_OFFLINE is set"),
])
def test_offline_switches_answer_without_a_socket(no_sockets, monkeypatch, env, url, expected):
    monkeypatch.setenv(env, "1")
    assert network_problem(url) == expected


def test_unreachable_host_is_reported_with_a_bounded_timeout(monkeypatch):
    seen = {}

    def fail(address, timeout=None):
        seen.update(address=address, timeout=timeout)
        raise OSError("Name or service not known")

    monkeypatch.setattr(socket, "create_connection", fail)
    monkeypatch.delenv("VISIONTF_OFFLINE", raising=False)
    assert not reachable("example.invalid")
    assert seen == {"address": ("example.invalid", 443), "timeout": downloads.CONNECT_TIMEOUT_S}
    assert network_problem("https://dl.fbaipublicfiles.com/detr/x.pth") == "dl.fbaipublicfiles.com is not reachable (no network?)"


def test_timm_weights_offline_use_the_hub_in_offline_mode_and_fail_at_once(no_sockets, monkeypatch):
    import huggingface_hub.constants as hf_constants
    import timm

    monkeypatch.setattr(downloads, "reachable", lambda *a, **k: False)
    calls = []

    def create_model(name, pretrained=False, **kwargs):
        # the hub client sees offline mode: it reads its cache (empty here) instead of retrying
        calls.append((name, hf_constants.HF_HUB_OFFLINE))
        raise OSError("cannot find the requested files in the local cache")

    monkeypatch.setattr(timm, "create_model", create_model)
    before = hf_constants.HF_HUB_OFFLINE
    start = time.monotonic()
    with pytest.raises(DownloadError, match="huggingface.co is not reachable.*pass pretrained=PATH") as info:
        visiontf.create_model("vit_tiny_patch16_224", pretrained=True)
    assert time.monotonic() - start < 5.0
    assert isinstance(info.value, UserError)
    assert calls == [("vit_tiny_patch16_224.augreg_in21k_ft_in1k", True)]
    assert hf_constants.HF_HUB_OFFLINE == before  # restored


def test_torch_hub_weights_offline_fail_before_the_download(no_sockets, monkeypatch):
    import torch

    monkeypatch.setattr(downloads, "reachable", lambda *a, **k: False)
    monkeypatch.setattr(downloads, "torch_hub_cached", lambda url: False)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", lambda *a, **k: pytest.fail("download attempted"))
    with pytest.raises(DownloadError, match="cannot download detr_resnet50 weights .* pass pretrained='/path/to/detr-r50-e632da11.pth'"):
        visiontf.models.get_entry("detr_resnet50").fetch_pretrained()


def test_torch_hub_cache_needs_no_network(no_sockets, monkeypatch):
    import torch

    monkeypatch.setattr(downloads, "torch_hub_cached", lambda url: True)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", lambda url, **k: {"model": {"w": torch.zeros(1)}})
    assert list(visiontf.models.get_entry("detr_resnet50").fetch_pretrained()) == ["w"]


def test_torchvision_backbone_offline_fails_at_once(no_sockets, monkeypatch):
    from visiontf.models.backbones.detr_backbone import _load_imagenet

    monkeypatch.setattr(downloads, "reachable", lambda *a, **k: False)
    monkeypatch.setattr(downloads, "torch_hub_cached", lambda url: False)
    with pytest.raises(DownloadError, match="torchvision resnet18 ImageNet weights.*backbone_pretrained="):
        _load_imagenet(None, "resnet18", True)
