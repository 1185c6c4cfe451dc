"""Real photographs without a download: the colour photos scikit-image ships inside its package.

``make_photos_dataset(out)`` writes ``out/train/*.png`` (astronaut, coffee, rocket, Hubble deep field,
immunohistochemistry, retina) and ``out/val/chelsea.png`` (a cat, held out), at their own sizes
(300x451 to 1411x1411). Needs ``scikit-image`` (``pip install scikit-image``); nothing is fetched.
"""
from __future__ import annotations

from pathlib import Path

TRAIN = ("astronaut", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
VAL = ("chelsea",)


def make_photos_dataset(out: str | Path, seed: int = 0, num_train: int | None = None, num_val: int | None = None) -> Path:
    """Write the photos as PNG; ``num_train``/``num_val`` take the first ones of each list (seed unused:
    the set is fixed)."""
    try:
        import skimage.data
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("--task photos needs scikit-image: pip install scikit-image") from e
    from PIL import Image

    out = Path(out)
    for split, names, n in (("train", TRAIN, num_train), ("val", VAL, num_val)):
        (out / split).mkdir(parents=True, exist_ok=True)
        for name in names[: n if n is not None else len(names)]:
            Image.fromarray(getattr(skimage.data, name)()[..., :3]).save(out / split / f"{name}.png")
    return out
