"""Fréchet Inception Distance (rFID of reconstructions, FID of samples) through torchmetrics, offline.

torchmetrics' ``FrechetInceptionDistance`` uses torch-fidelity's InceptionV3 (the TF-Inception port
that published FIDs use, taming's included), whose weights are a download
(``weights-inception-2015-12-05-6726825d.pth``). :func:`frechet_inception_distance` never downloads:
it reads the file from the torch hub cache (``$TORCH_HOME/hub/checkpoints/``) or a given path and,
when it is absent, raises :class:`InceptionWeightsMissing` naming the file, the folder and the URL.
A random Inception would give numbers comparable to nothing, so none is substituted; a custom
``feature`` module (torchmetrics' own option) replaces Inception explicitly, e.g. in tests.

Images go in as float in [0, 1] (``normalize=True``); torchmetrics resizes them to 299 px as
torch-fidelity does.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from visiontf.core.errors import UserError
from visiontf.io.weights import safe_torch_load

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_URL = "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/" + INCEPTION_FILE


class InceptionWeightsMissing(UserError, FileNotFoundError):
    """FID needs torch-fidelity's InceptionV3 weights (or torch-fidelity itself), absent on this machine."""


def inception_path(path: str | Path | None = None) -> Path:
    """The Inception weights file: ``path`` when given, else the torch hub cache's."""
    return Path(path) if path else Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_FILE


def frechet_inception_distance(weights: str | Path | None = None, feature: nn.Module | None = None):
    """A ``torchmetrics.image.fid.FrechetInceptionDistance`` on 2048-d Inception pool features, for images in [0, 1].

    ``feature``: a module mapping (B, 3, H, W) images in [0, 1] to (B, D) features instead of Inception.
    """
    from torchmetrics.image.fid import FrechetInceptionDistance

    if feature is not None:
        return FrechetInceptionDistance(feature=feature, normalize=True, reset_real_features=True)
    try:
        import torch_fidelity  # noqa: F401 - torchmetrics' Inception lives there
    except ModuleNotFoundError as e:
        raise InceptionWeightsMissing(
            "FID needs torch-fidelity (torchmetrics' InceptionV3): pip install torch-fidelity "
            "(or pip install 'visiontf[fid]')") from e
    path = inception_path(weights)
    if not path.is_file():
        raise InceptionWeightsMissing(
            f"FID needs torch-fidelity's InceptionV3 weights at {path} (not found; nothing is downloaded at run time): "
            f"place {INCEPTION_FILE} in {path.parent} (from {INCEPTION_URL}), or give its path with "
            "model.init_args.fid_inception=PATH")
    # torch-fidelity reads the file with a bare torch.load, which a setting of the environment
    # (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD) turns into unpickling: read as data here first, a file holding
    # anything but weights is refused before it gets there (the path may come from a checkpoint's arguments)
    safe_torch_load(path)
    return FrechetInceptionDistance(feature=2048, normalize=True, reset_real_features=True,
                                    feature_extractor_weights_path=str(path))
