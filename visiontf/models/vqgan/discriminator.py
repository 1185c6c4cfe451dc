"""VQGAN's patch discriminator: taming's ``NLayerDiscriminator`` (the pix2pix PatchGAN).

Layout (taming ``taming/modules/discriminator/model.py``, carried as facts): a 4x4 conv stride 2 to
``ndf`` channels + LeakyReLU(0.2); ``n_layers - 1`` blocks of 4x4 conv stride 2 (no bias) +
BatchNorm + LeakyReLU(0.2) doubling the channels (at most 8 x ndf); one such block at stride 1; a
4x4 conv stride 1 to one logit per patch. Weights: convs N(0, 0.02), BatchNorm scale N(1, 0.02),
bias 0 (taming's ``weights_init``). ndf 64, 3 layers: 2.77 M parameters; a 256 px image gives a
30x30 map of logits, each seeing a 70x70 patch. Keys ``main.{i}`` as taming's ``loss.discriminator.main.{i}``.
"""
from __future__ import annotations

from torch import Tensor, nn


class NLayerDiscriminator(nn.Module):
    """PatchGAN: images (B, C, H, W) in [-1, 1] -> logits (B, 1, h, w), one per overlapping patch."""

    def __init__(self, input_nc: int = 3, ndf: int = 64, n_layers: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(input_nc, ndf, 4, stride=2, padding=1), nn.LeakyReLU(0.2, True)]
        mult = 1
        for n in range(1, n_layers + 1):
            prev, mult = mult, min(2**n, 8)
            stride = 2 if n < n_layers else 1
            layers += [nn.Conv2d(ndf * prev, ndf * mult, 4, stride=stride, padding=1, bias=False),
                       nn.BatchNorm2d(ndf * mult), nn.LeakyReLU(0.2, True)]
        layers.append(nn.Conv2d(ndf * mult, 1, 4, stride=1, padding=1))
        self.main = nn.Sequential(*layers)
        self.apply(_weights_init)

    def forward(self, x: Tensor) -> Tensor:
        return self.main(x)


def _weights_init(m: nn.Module) -> None:
    if isinstance(m, nn.Conv2d):
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif isinstance(m, nn.BatchNorm2d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)
