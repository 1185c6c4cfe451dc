"""VQGAN's training loss, the parts of taming's ``VQLPIPSWithDiscriminator`` (``taming/modules/losses/
vqperceptual.py``) that are not the discriminator itself (:mod:`visiontf.models.vqgan.discriminator`).

* reconstruction: ``mean(|x - x_rec|) + perceptual_weight * mean(LPIPS(x, x_rec))`` (taming adds the
  per-image LPIPS to every pixel's L1 before the mean, which is the same number);
* generator: ``g = -mean(D(x_rec))``, weighted by the adaptive weight
  ``||grad nll|| / (||grad g|| + 1e-4)`` on the decoder's last weight, clamped to [0, 1e4], times
  ``disc_weight`` (0.8 in taming's ImageNet configs), and by 0 before ``disc_start``;
* discriminator: hinge ``(mean(relu(1 - D(x))) + mean(relu(1 + D(x_rec)))) / 2``.

LPIPS is the ``lpips`` package (its linear layers ship in the wheel: ``weights/v0.1/vgg.pth``, the
file taming downloads) on torchvision's ImageNet VGG16, which is a download
(``vgg16-397923af.pth``). :func:`load_lpips` reads that file from the torch hub cache (or a given
path) and never downloads: absent, it raises :class:`LPIPSWeightsMissing` with the command that
fetches it. A VGG16 of random weights would make LPIPS meaningless, so it is never used.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.core.errors import UserError
from visiontf.io.weights import safe_torch_load

log = logging.getLogger(__name__)

VGG16_FILE = "vgg16-397923af.pth"  # torchvision's VGG16_Weights.IMAGENET1K_V1
VGG16_URL = "https://download.pytorch.org/models/" + VGG16_FILE


class LPIPSWeightsMissing(UserError, FileNotFoundError):
    """LPIPS needs torchvision's ImageNet VGG16, which is not on this machine."""


def vgg16_path(path: str | Path | None = None) -> Path:
    """The VGG16 file: ``path`` when given, else the torch hub cache's (``$TORCH_HOME/hub/checkpoints``)."""
    return Path(path) if path else Path(torch.hub.get_dir()) / "checkpoints" / VGG16_FILE


def load_lpips(vgg16_file: str | Path | None = None) -> nn.Module:
    """``lpips.LPIPS(net="vgg")`` in eval mode, frozen, with its VGG16 trunk read from ``vgg16_file``
    (default: the torch hub cache). Raises :class:`LPIPSWeightsMissing` (with the fix) when absent."""
    import lpips

    path = vgg16_path(vgg16_file)
    if not path.is_file():
        raise LPIPSWeightsMissing(
            f"LPIPS needs torchvision's ImageNet VGG16 weights at {path} (not found, and nothing is downloaded at run "
            f"time). Fetch them once with: python -c \"import torchvision; torchvision.models.vgg16(weights='IMAGENET1K_V1')\" "
            f"(or copy {VGG16_URL} there, or pass model.init_args.lpips_vgg16={path.name}-path), or train without "
            f"the perceptual term: model.init_args.perceptual_weight=0")
    metric = lpips.LPIPS(net="vgg", pretrained=True, pnet_rand=True, verbose=False)
    features = {k[len("features."):]: v for k, v in safe_torch_load(path).items()
                if k.startswith("features.")}
    trunk = metric.net
    layers = {name: m for s in range(1, trunk.N_slices + 1) for name, m in getattr(trunk, f"slice{s}").named_children()}
    for key, value in features.items():
        index, what = key.split(".")
        if index in layers:
            getattr(layers[index], what).data.copy_(value)
    metric.eval().requires_grad_(False)
    return metric


def hinge_d_loss(logits_real: Tensor, logits_fake: Tensor) -> Tensor:
    return 0.5 * (F.relu(1.0 - logits_real).mean() + F.relu(1.0 + logits_fake).mean())


def adaptive_weight(nll: Tensor, g_loss: Tensor, last_layer: Tensor, disc_weight: float) -> Tensor:
    """taming's ``calculate_adaptive_weight``: the generator term's weight that balances its gradient on
    ``last_layer`` against the reconstruction's, clamped to [0, 1e4], times ``disc_weight`` (no gradient)."""
    nll_grad = torch.autograd.grad(nll, last_layer, retain_graph=True)[0]
    g_grad = torch.autograd.grad(g_loss, last_layer, retain_graph=True)[0]
    weight = torch.norm(nll_grad.float()) / (torch.norm(g_grad.float()) + 1e-4)
    return torch.clamp(weight, 0.0, 1e4).detach() * disc_weight


@torch.no_grad()
def code_usage(indices: Tensor, num_codes: int) -> dict[str, Tensor]:
    """``perplexity`` (exp of the code histogram's entropy) and ``used`` (fraction of codes that occur)."""
    counts = torch.bincount(indices.reshape(-1), minlength=num_codes).float()
    p = counts / counts.sum().clamp_min(1)
    return {"perplexity": torch.exp(-(p * torch.log(p + 1e-10)).sum()), "used": (counts > 0).float().mean()}


def psnr(x: Tensor, y: Tensor) -> Tensor:
    """Per-image PSNR in dB of images in [-1, 1] (peak 2, i.e. 255 on 0..255 pixels), (B,)."""
    mse = ((x.float() - y.float()) ** 2).flatten(1).mean(1)
    return 10 * torch.log10(4.0 / mse.clamp_min(1e-10))
