"""A tiny hand-made detection dataset in the layouts users bring: COCO, Roboflow/CVAT COCO exports, YOLO.

Coloured rectangles and ellipses on noise, a few images per split, category ids 3, 7 and 12 (not
contiguous, and not 1..K), so that every tool has to carry the real ids through. Plain PIL and
JSON: the point is to write these files the way other tools do, not the way visiontf reads them.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

#: category id -> name; ids deliberately non-contiguous
CATEGORIES = {3: "circle", 7: "square", 12: "bar"}
_COLOURS = {3: (230, 50, 40), 7: (40, 190, 70), 12: (50, 90, 230)}
SIZE = (96, 128)  # (height, width)


def _draw_split(rng: np.random.Generator, n: int) -> list[tuple[Image.Image, list[tuple[int, list[float]]]]]:
    out = []
    h, w = SIZE
    for _ in range(n):
        img = Image.fromarray(rng.integers(90, 170, size=(h, w, 3), dtype=np.uint8))
        draw = ImageDraw.Draw(img)
        objects = []
        for cat in rng.choice(list(CATEGORIES), size=int(rng.integers(1, 3)), replace=False):
            bw, bh = int(rng.integers(24, 48)), int(rng.integers(24, 40))
            if cat == 12:
                bw, bh = int(rng.integers(50, 70)), int(rng.integers(12, 18))
            x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            box = (x0, y0, x0 + bw, y0 + bh)
            (draw.ellipse if cat == 3 else draw.rectangle)(box, fill=_COLOURS[int(cat)])
            objects.append((int(cat), [float(x0), float(y0), float(bw), float(bh)]))
        out.append((img, objects))
    return out


def _coco_json(items, names: list[str], roboflow: bool) -> dict:
    cats = [{"id": cid, "name": name, "supercategory": "shapes" if roboflow else "shape"} for cid, name in CATEGORIES.items()]
    if roboflow:  # Roboflow lists the project itself as category 0, the others' supercategory
        cats.insert(0, {"id": 0, "name": "shapes", "supercategory": "none"})
    images, anns = [], []
    for i, ((img, objects), name) in enumerate(zip(items, names), start=1):
        images.append({"id": 100 + i, "file_name": name, "width": img.width, "height": img.height})
        for cat, box in objects:
            anns.append({"id": len(anns) + 1, "image_id": 100 + i, "category_id": cat, "bbox": box,
                         "area": box[2] * box[3], "iscrowd": 0})
    return {"images": images, "annotations": anns, "categories": cats}


def make_dataset(root: str | Path, layout: str = "coco", num_train: int = 4, num_val: int = 2, seed: int = 0) -> Path:
    """Write the dataset under ``root`` in ``layout``: ``coco`` (train/val images + annotations/*.json),
    ``roboflow`` (train/, valid/ with _annotations.coco.json, category 0 as supercategory),
    ``cvat`` (images/<subset>/, annotations/instances_<subset>.json) or ``yolo`` (Roboflow's YOLO export)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    splits = {"train": _draw_split(rng, num_train), "val": _draw_split(rng, num_val)}
    for split, items in splits.items():
        names = [f"{split}_{i:03d}.jpg" for i in range(len(items))]
        if layout == "coco":
            img_dir, ann = root / "images" / split, root / "annotations" / f"{split}.json"
        elif layout == "roboflow":
            img_dir = root / ("valid" if split == "val" else split)
            ann = img_dir / "_annotations.coco.json"
        elif layout == "cvat":
            subset = {"train": "Train", "val": "Validation"}[split]
            img_dir, ann = root / "images" / subset, root / "annotations" / f"instances_{subset}.json"
        elif layout == "yolo":
            img_dir = root / ("valid" if split == "val" else split) / "images"
            ann = None
        else:
            raise ValueError(layout)
        img_dir.mkdir(parents=True, exist_ok=True)
        for (img, objects), name in zip(items, names):
            img.save(img_dir / name, quality=95)
            if layout == "yolo" and objects:
                ids = sorted(CATEGORIES)
                lines = [f"{ids.index(cat)} {(x + w / 2) / img.width:.6f} {(y + h / 2) / img.height:.6f} "
                         f"{w / img.width:.6f} {h / img.height:.6f}" for cat, (x, y, w, h) in objects]
                label = img_dir.parent / "labels" / (Path(name).stem + ".txt")
                label.parent.mkdir(parents=True, exist_ok=True)
                label.write_text("\n".join(lines) + "\n")
        if ann is not None:
            ann.parent.mkdir(parents=True, exist_ok=True)
            ann.write_text(json.dumps(_coco_json(items, names, roboflow=layout == "roboflow")))
    if layout == "yolo":  # as Roboflow writes it: paths relative to a folder above the YAML
        names = [CATEGORIES[c] for c in sorted(CATEGORIES)]
        (root / "data.yaml").write_text(f"train: ../train/images\nval: ../valid/images\n\nnc: {len(names)}\nnames: {names}\n")
    return root


def own_detections_as_truth(ckpt: Path, data: Path, out: Path) -> Path:
    """``data`` (a COCO layout) with its validation truth replaced by every detection of the checkpoint's
    model, at batch 1 and float32: a few-step model then scores far from 0 on it, so that a change of
    precision or post-processing has something to lose, which it would not against the real truth."""
    import shutil

    from visiontf.inference.predictor import Predictor

    shutil.copytree(data, out)
    ann_file = out / "annotations" / "instances_val2017.json"
    ann = json.loads(ann_file.read_text())
    predictor = Predictor.from_checkpoint(ckpt, device="cpu", batch_size=1)  # as eval below: no padding between images
    results = predictor([out / "val2017" / im["file_name"] for im in ann["images"]], score_threshold=None)
    ann["annotations"] = []
    for im, r in zip(ann["images"], results):
        for box, label in zip(r["boxes"].tolist(), r["labels"].tolist()):
            x0, y0, x1, y1 = box
            ann["annotations"].append({"id": len(ann["annotations"]) + 1, "image_id": im["id"], "iscrowd": 0,
                                       "category_id": predictor.label_to_cat_id[label],
                                       "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)})
    ann_file.write_text(json.dumps(ann))
    return out


def shapes_batch(B=2, size=64, seed=0):
    """Images with one or two flat rectangles each, their boxes, labels and exact masks."""
    g = torch.Generator().manual_seed(seed)
    images, targets = torch.zeros(B, 3, size, size), []
    for b in range(B):
        masks, boxes, labels = [], [], []
        for k in range(1 + b % 2):
            x0, y0 = (int(v) for v in torch.randint(0, size // 2, (2,), generator=g))
            w, h = (int(v) for v in torch.randint(size // 4, size // 2, (2,), generator=g))
            m = torch.zeros(size, size, dtype=torch.uint8)
            m[y0:y0 + h, x0:x0 + w] = 1
            images[b, k % 3][m.bool()] = 2.0
            masks.append(m)
            boxes.append([(x0 + w / 2) / size, (y0 + h / 2) / size, w / size, h / size])
            labels.append(k)
        targets.append({"masks": torch.stack(masks), "boxes": torch.tensor(boxes), "labels": torch.tensor(labels)})
    return images, targets


#: a detection run of a few seconds on a hand-made COCO set (the custom-dataset walkthrough, fine-tuning tests)
TINY_COCO_MODEL = "{backbone: {frozen_bn: false, freeze_stem: false}, arch: {num_queries: 10, enc_layers: 1, dec_layers: 1}}"
TINY_COCO_RUN = ["--trainer.max_epochs=1", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--data.init_args.num_workers=0", "--data.init_args.batch_size=2", "--data.init_args.scales=[64]",
        "--data.init_args.max_size=96", "--data.init_args.crop_scales=[64]", "--data.init_args.crop_size=[48,64]",
        "--data.init_args.val_size=64", f"--model.init_args.model_kwargs={TINY_COCO_MODEL}"]
