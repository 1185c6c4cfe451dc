"""Real photographs without a download: the pictures scikit-image ships inside its package.

``make_photos_dataset(out)`` writes ``out/train/*.png`` and ``out/val/*.png``: colour photographs
(astronaut, rocket, Hubble deep field, immunohistochemistry, retina, motorcycle) and grayscale ones
(camera, brick, grass, gravel, moon: written as grayscale PNGs, which the data modules convert to RGB)
for training; ``coffee`` and ``chelsea`` held out for validation. One set for every recipe on real
photographs (IPT super-resolution, the VQGAN tokenizer). Needs ``scikit-image`` (the ``photos``
extra); nothing is downloaded.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from visiontf.core.errors import UserError

TRAIN = ("astronaut", "rocket", "hubble_deep_field", "immunohistochemistry", "retina", "motorcycle",
         "camera", "brick", "grass", "gravel", "moon")
VAL = ("coffee", "chelsea")


def _photo(name: str) -> np.ndarray:
    import skimage.data as data

    if name == "motorcycle":
        return data.stereo_motorcycle()[0]
    return getattr(data, name)()


def make_photos_dataset(out: str | Path, seed: int = 0, num_train: int | None = None, num_val: int | None = None,
                        **_: object) -> Path:
    """Write the photos (deterministic; ``seed`` unused) and return ``out``. ``num_train`` / ``num_val``
    keep the first ones of each list (tests)."""
    try:
        import skimage  # noqa: F401
    except ImportError as e:
        raise UserError("--task photos writes scikit-image's photographs: pip install scikit-image "
                        "(or pip install visiontf[photos])") from e
    out = Path(out)
    for split, names in (("train", TRAIN[:num_train]), ("val", VAL[:num_val])):
        (out / split).mkdir(parents=True, exist_ok=True)
        for name in names:
            Image.fromarray(_photo(name)).save(out / split / f"{name}.png")
    return out
