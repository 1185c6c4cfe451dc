"""Real COCO 2017 images and annotations (tests/fixtures/coco_real, see its README) through visiontf's COCO path.

The synthetic sets have none of real COCO's quirks: grayscale JPEGs, crowd regions (``iscrowd=1``),
80 category ids spread over 1..90, images of every size and an image without objects. The folder
also holds one EXIF-rotated copy (Orientation 6; none of the source's 200 images had the tag), its
annotation in the displayed frame, and the unrotated original in the other split.
"""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from visiontf.data.io import read_image
from visiontf.data.loading import EpochIndex
from visiontf.data.transforms import detection as DT
from visiontf.evaluation.coco import STAT_NAMES, CocoEvalError, evaluate_coco
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.coco_dataset import CocoDetection
from visiontf.tasks.detection.coco_metric import CocoMetric

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "fixtures" / "coco_real"
TRAIN_ANN = DATA / "annotations" / "instances_train2017.json"
VAL_ANN = DATA / "annotations" / "instances_val2017.json"
GRAY_ID, CROWD_TRAIN_ID, CROWD_VAL_ID, EXIF_ID = 10125, 10136, 12670, 13291
EXIF_FILE = "000000013291_exif_orientation6.jpg"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_data_has_what_real_coco_has():
    """Guards the folder itself: if it lost its grayscale, crowd, EXIF or > 80 ids, the tests below would prove less."""
    train, val = _load(TRAIN_ANN), _load(VAL_ANN)
    assert len(train["categories"]) == len(val["categories"]) == 80
    assert max(c["id"] for c in val["categories"]) == 90
    assert Image.open(DATA / "train2017" / "000000010125.jpg").mode == "L"
    for data in (train, val):
        assert sum(a["iscrowd"] for a in data["annotations"]) == 1
        assert max(a["category_id"] for a in data["annotations"]) > 80
    stored = Image.open(DATA / "val2017" / EXIF_FILE)
    assert stored.getexif().get(0x0112) == 6 and stored.size == (335, 500)  # stored portrait, displayed landscape
    entry = next(im for im in val["images"] if im["id"] == EXIF_ID)
    assert (entry["width"], entry["height"]) == (500, 335)


def test_data_module_keeps_coco_ids_and_trains_on_no_crowd_region():
    dm = CocoDataModule(DATA, num_workers=0)
    assert dm.num_classes == 80
    # contiguous labels 0..79 for the model, COCO's ids (with their gaps) everywhere else
    assert dm.label_to_cat_id[0] == 1 and dm.label_to_cat_id[79] == 90 and dm.class_names[79] == "toothbrush"
    assert dm.cat_id_to_label[88] == 77 and 12 not in dm.cat_id_to_label  # 12 is one of COCO's unused ids
    dm.setup("fit")
    index = dm.train_dataset.index
    assert index.counts["crowd"] == 1
    pos = next(i for i, im in enumerate(index.images) if im["id"] == CROWD_TRAIN_ID)
    anns = [a for a in _load(TRAIN_ANN)["annotations"] if a["image_id"] == CROWD_TRAIN_ID]
    assert len(index.boxes[pos]) == len(anns) - 1 == 14  # every box but the crowd region
    crowd_box = next(a["bbox"] for a in anns if a["iscrowd"])
    assert not any(np.allclose(b, crowd_box, atol=1e-3) for b in index.boxes[pos])


class _Spy:
    """Records what the dataset's albumentations pipeline got and gave (source boxes, ``ann_index``)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, **kwargs):
        out = self.inner(**kwargs)
        self.calls.append((kwargs, out))
        return out


def _patch(img: np.ndarray, box, n: int = 24) -> np.ndarray:
    """The standardised gray content of an ``xywh`` box, resampled to n x n."""
    x, y, w, h = (float(v) for v in box)
    crop = img[int(round(y)):int(round(y + h)), int(round(x)):int(round(x + w))].astype(np.float32).mean(axis=2)
    p = cv2.resize(crop, (n, n), interpolation=cv2.INTER_AREA)
    return (p - p.mean()) / (p.std() + 1e-6)


def _to_pixels(image: torch.Tensor) -> np.ndarray:
    mean, std = np.array(DT.IMAGENET_MEAN) * 255, np.array(DT.IMAGENET_STD) * 255
    return image.permute(1, 2, 0).numpy() * std + mean


def test_augmented_boxes_stay_inside_the_image_and_on_their_objects():
    """DETR's COCO augmentation (flip, multi-scale, random crop) on the real images: every box stays inside
    the image, and each box that was not cut by a crop still frames the same content as in the source
    image (mirrored when the image was flipped). A box left in the unflipped frame, or moved by a wrong
    scale, frames other content (correlation around 0.2-0.4 here instead of > 0.9)."""
    dm = CocoDataModule(DATA, num_workers=0)  # DETR's own sizes: 480..800, crops 384..600
    dm.setup("fit")
    ds = dm.train_dataset
    spy = _Spy(ds.transform)
    ds.transform = spy
    checked, flipped_seen = 0, set()
    for epoch in range(4):
        for i in range(len(ds)):
            spy.calls.clear()
            image, target = ds[EpochIndex(i, epoch)]
            (given, out), = spy.calls
            th, tw = target["size"].tolist()
            assert image.shape == (3, th, tw)
            boxes = target["boxes"]
            assert len(boxes) == len(target["labels"]) == len(out["ann_index"])
            assert ((boxes >= 0) & (boxes <= 1)).all() and (boxes[:, 2:] > 0).all()
            xyxy = torch.cat([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], 1)
            assert ((xyxy >= -1e-5) & (xyxy <= 1 + 1e-5)).all()
            pixels = _to_pixels(image)
            if target["image_id"] == GRAY_ID:  # grayscale: three equal channels after undoing the normalisation
                assert np.abs(pixels[..., 0] - pixels[..., 1]).max() < 1e-3
            flips = set()
            for box, k in zip(np.asarray(out["bboxes"]).reshape(-1, 4), np.asarray(out["ann_index"], dtype=int)):
                src = given["bboxes"][k]
                assert target["labels"][list(out["ann_index"]).index(k)] == given["labels"][k]
                sx, sy = box[2] / src[2], box[3] / src[3]
                if abs(sx / sy - 1) > 0.02 or min(box[2:]) < 16 or min(src[2:]) < 16:
                    continue  # cut by the crop, or too small to compare
                a, b = _patch(given["image"], src), _patch(pixels, box)
                plain, mirrored = float((a * b).mean()), float((a[:, ::-1] * b).mean())
                assert max(plain, mirrored) > 0.85, (target["image_id"], epoch, src, box, plain, mirrored)
                flips.add(mirrored > plain)
                checked += 1
            assert len(flips) <= 1, f"image {target['image_id']}: some boxes flipped and some not"
            flipped_seen |= flips
    assert checked >= 40 and flipped_seen == {True, False}


def test_exif_rotated_image_loads_upright_with_boxes_in_the_displayed_frame():
    rotated = CocoDetection(DATA / "val2017", VAL_ANN)  # no geometry: normalisation only
    original = CocoDetection(DATA / "train2017", TRAIN_ANN)
    pos_r = next(i for i, im in enumerate(rotated.index.images) if im["id"] == EXIF_ID)
    pos_o = next(i for i, im in enumerate(original.index.images) if im["id"] == EXIF_ID)
    (img_r, t_r), (img_o, t_o) = rotated[pos_r], original[pos_o]
    assert img_r.shape == img_o.shape == (3, 335, 500)
    assert rotated.size_mismatches() == []  # the upright size is the annotated one: no clipping to 335 x 500
    # the same picture up to the re-encoding (the stored pixels read as they are would be 500 x 335)
    assert (_to_pixels(img_r) - _to_pixels(img_o)).__abs__().mean() < 4
    assert np.asarray(Image.open(DATA / "val2017" / EXIF_FILE)).shape[:2] == (500, 335)
    assert torch.equal(t_r["boxes"], t_o["boxes"]) and len(t_r["boxes"]) == 8
    assert torch.equal(t_r["orig_size"], torch.tensor([335, 500]))
    # every box frames the same content in both
    pix_r, pix_o = _to_pixels(img_r), _to_pixels(img_o)
    for cx, cy, w, h in (t_r["boxes"] * torch.tensor([500, 335, 500, 335])).tolist():
        if min(w, h) >= 16:
            box = [cx - w / 2, cy - h / 2, w, h]
            assert float((_patch(pix_r, box) * _patch(pix_o, box)).mean()) > 0.95


def test_grayscale_jpeg_reads_as_three_channels():
    arr = read_image(DATA / "train2017" / "000000010125.jpg")
    assert arr.shape == (436, 640, 3) and arr.dtype == np.uint8
    assert np.array_equal(arr[..., 0], arr[..., 1]) and np.array_equal(arr[..., 1], arr[..., 2])
    assert np.array_equal(arr[..., 0], np.asarray(Image.open(DATA / "train2017" / "000000010125.jpg")))


# ---------------------------------------------------------------- evaluation: crowd regions as COCO ignores them

def _detections_on_truth(gt: dict, crowd_score: float = 0.95) -> list[dict]:
    """Every non-crowd box as a detection (a seeded jitter, so AP is not trivially 1), plus two
    detections on every crowd region (its own box and a shifted one) and a few false positives."""
    rng = np.random.default_rng(0)
    dets = []
    for a in gt["annotations"]:
        x, y, w, h = a["bbox"]
        if a["iscrowd"]:
            dets.append({"image_id": a["image_id"], "category_id": a["category_id"], "bbox": [x, y, w, h], "score": crowd_score})
            dets.append({"image_id": a["image_id"], "category_id": a["category_id"],
                         "bbox": [x + 0.1 * w, y + 0.1 * h, 0.5 * w, 0.5 * h], "score": crowd_score})
            continue
        jx, jy, jw, jh = rng.uniform(-0.12, 0.12, size=4)
        dets.append({"image_id": a["image_id"], "category_id": a["category_id"], "score": float(rng.uniform(0.3, 0.9)),
                     "bbox": [x + jx * w, y + jy * h, w * (1 + jw), h * (1 + jh)]})
    for im in gt["images"]:  # a false positive per image (a category the image lacks)
        dets.append({"image_id": im["id"], "category_id": 90, "bbox": [5.0, 5.0, 60.0, 40.0], "score": 0.6})
    return dets


def _pycocotools(gt: dict, dets: list[dict]) -> list[float]:
    """COCOeval as its users call it, nothing of visiontf in between."""
    coco = COCO()
    coco.dataset = copy.deepcopy(gt)
    coco.createIndex()
    ev = COCOeval(coco, coco.loadRes(copy.deepcopy(dets)), "bbox")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return [float(s) for s in ev.stats]


def _metric_stats(ann_file: Path, dets: list[dict]) -> list[float]:
    """The same detections through the training-time metric (contiguous labels, xyxy boxes)."""
    data = _load(ann_file)
    label_of = {c["id"]: i for i, c in enumerate(data["categories"])}
    metric = CocoMetric(ann_file, [c["id"] for c in data["categories"]], backend="pycocotools")
    for im in data["images"]:
        mine = [d for d in dets if d["image_id"] == im["id"]]
        boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (d["bbox"] for d in mine)], dtype=torch.float64)
        metric.update([{"boxes": boxes.reshape(-1, 4), "scores": torch.tensor([d["score"] for d in mine]),
                        "labels": torch.tensor([label_of[d["category_id"]] for d in mine], dtype=torch.int64)}], [im["id"]])
    return [float(v) for v in metric.compute().values()]


@pytest.mark.parametrize("ann_file", [VAL_ANN, TRAIN_ANN], ids=["val", "train"])
def test_crowd_regions_are_ignored_as_pycocotools_does(ann_file, tmp_path):
    gt = _load(ann_file)
    dets = _detections_on_truth(gt)
    ref = _pycocotools(gt, dets)
    assert 0.3 < ref[0] < 0.95  # non-trivial
    for backend in ("pycocotools", "faster_coco_eval"):
        ours = evaluate_coco(ann_file, dets, backend=backend)
        assert list(ours.values()) == pytest.approx(ref, abs=1e-9), backend
    results = tmp_path / "results.json"
    results.write_text(json.dumps(dets))
    assert list(evaluate_coco(ann_file, results).values()) == pytest.approx(ref, abs=1e-9)
    # float32 boxes in the metric: equal to pycocotools within their rounding
    assert _metric_stats(ann_file, dets) == pytest.approx(ref, abs=1e-4)

    # the detections on crowd regions are not false positives: removing them leaves AP and AR@100 as they
    # are. COCOeval keeps each image's top maxDets detections before it sets the crowd matches aside, so
    # these two high-scoring ones take places of AR@1 and AR@10, which can only gain without them
    no_crowd_dets = [d for d in dets if d["score"] != 0.95]
    without = evaluate_coco(ann_file, no_crowd_dets, backend="pycocotools")
    for i, name in enumerate(STAT_NAMES):
        if name in ("AR_1", "AR_10"):
            assert without[name] >= ref[i] - 1e-12
        else:
            assert without[name] == pytest.approx(ref[i], abs=1e-12), name
    # ... whereas without the crowd regions in the truth, the same detections cost precision
    without_crowd = {**gt, "annotations": [a for a in gt["annotations"] if not a["iscrowd"]]}
    assert evaluate_coco(without_crowd, dets, backend="pycocotools")["AP"] < ref[0] - 0.005


# ---------------------------------------------------------------- bad input: crowd-only images, foreign category ids

def _crowd_only(ann_file: Path, image_id: int) -> dict:
    """The file with ``image_id`` keeping only its crowd region(s)."""
    data = _load(ann_file)
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] != image_id or a["iscrowd"]]
    assert any(a["image_id"] == image_id for a in data["annotations"])
    return data


def test_an_image_with_only_crowd_regions_trains_on_no_object_and_evaluates_as_pycocotools(tmp_path):
    from visiontf.tasks.detection.coco_dataset import collate_detection
    from visiontf.tasks.detection.detection_task import DetectionTask

    root = tmp_path / "coco"
    shutil.copytree(DATA, root, ignore=shutil.ignore_patterns("*.py", "*.md"))
    (root / "annotations" / "instances_train2017.json").write_text(json.dumps(_crowd_only(TRAIN_ANN, CROWD_TRAIN_ID)))
    dm = CocoDataModule(root, num_workers=0, scales=[96], max_size=160, crop_scales=[96], crop_size=[64, 96], val_size=96)
    dm.setup("fit")
    ds = dm.train_dataset
    pos = next(i for i, im in enumerate(ds.index.images) if im["id"] == CROWD_TRAIN_ID)
    image, target = ds[pos]
    assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)
    # a batch of that image alone (and one with the empty COCO image): every query learns "no object"
    empty = next(i for i, im in enumerate(ds.index.images) if im["id"] == 10263)
    task = DetectionTask(num_classes=dm.num_classes, model_kwargs={"arch": {"hidden_dim": 32, "nheads": 2, "enc_layers": 1,
                         "dec_layers": 1, "dim_feedforward": 32, "num_queries": 6}})
    task.train()
    _, losses, _ = task._step(collate_detection([ds[pos], ds[empty]]))
    assert torch.isfinite(losses["loss"]) and losses["loss"] > 0
    losses["loss"].backward()
    assert task.model.class_embed.weight.grad.abs().sum() > 0

    # evaluation: COCOeval sets detections on a crowd region aside; the image's other detections are false positives
    gt = _crowd_only(VAL_ANN, CROWD_VAL_ID)
    dets = _detections_on_truth(gt)
    ref = _pycocotools(gt, dets)
    for backend in ("pycocotools", "faster_coco_eval"):
        assert list(evaluate_coco(gt, dets, backend=backend).values()) == pytest.approx(ref, abs=1e-9), backend
    # only that image: no object to find, so COCO's -1 for every stat (not an error, not 0)
    only = evaluate_coco(gt, [d for d in dets if d["image_id"] == CROWD_VAL_ID], img_ids=[CROWD_VAL_ID])
    assert list(only.values()) == [-1.0] * 12


def test_results_with_category_ids_not_in_the_annotations_are_refused_naming_them(tmp_path):
    gt = _load(VAL_ANN)
    dets = _detections_on_truth(gt)
    label_of = {c["id"]: i for i, c in enumerate(sorted(gt["categories"], key=lambda c: c["id"]))}
    as_labels = [{**d, "category_id": label_of[d["category_id"]]} for d in dets]  # the classic mistake
    # what pycocotools does with them: no error, it scores only the file's categories (here AP 0.49 -> 0.00)
    assert _pycocotools(gt, as_labels)[0] < _pycocotools(gt, dets)[0] - 0.1
    results = tmp_path / "results.json"
    results.write_text(json.dumps(as_labels))
    with pytest.raises(CocoEvalError) as e:
        evaluate_coco(VAL_ANN, results)
    msg = str(e.value)
    foreign = sorted({d["category_id"] for d in as_labels} - set(label_of))
    assert 0 in foreign and f"category id(s) {foreign[:5]}" in msg  # named, e.g. 0, which no COCO category has
    assert msg.startswith(f"{results}: ") and str(VAL_ANN) in msg and "contiguous training labels 0..79" in msg
    one_wrong = tmp_path / "one_wrong.json"
    one_wrong.write_text(json.dumps(dets[:5] + [{**dets[5], "category_id": 91}]))
    with pytest.raises(CocoEvalError, match=r"1 result\(s\) use category id\(s\) \[91\] \(1 in all\) that are not in"):
        evaluate_coco(VAL_ANN, one_wrong, backend="faster_coco_eval")

    from cli_runner import error_line, run_tools

    cases = [{"argv": [tool, "--annotations", VAL_ANN, "--predictions", results]}
             for tool in ("tools/eval.py",)]
    for r in run_tools(cases, tmp_path):
        assert r["code"] == 2
        line = error_line(r)
        assert str(results) in line and f"category id(s) {foreign[:5]}" in line and str(VAL_ANN) in line


# ---------------------------------------------------------------- the tools end to end on real COCO

CONFIG = "configs/deformable_detr/deformable_detr_tiny_shapes.yaml"
TOY_MODEL = ("--model.init_args.model_kwargs={arch: {hidden_dim: 32, nheads: 2, enc_layers: 1, dec_layers: 2, "
             "dim_feedforward: 32, num_queries: 12}, dino: {num_denoising: 6, num_query_groups: 2, "
             "distinct_query_iou: 0.8, distinct_between_layers: true}}")
# batches of 3: the 2 steps see all 5 training images, the crowd-only and the empty one among them
TOY_DATA = ["--data.init_args.num_workers=0", "--data.init_args.batch_size=3", "--data.init_args.scales=[96]",
            "--data.init_args.max_size=160", "--data.init_args.crop_scales=[96]", "--data.init_args.val_size=96",
            "--trainer.devices=1", "--trainer.strategy=auto", "--precision_without_native_bf16=null",
            "--trainer.precision=32-true"]
#: ids COCO skips within 1..90, and 0: a contiguous label would show up as one of them
NOT_COCO_IDS = {0, 12, 26, 29, 30, 45, 66, 68, 69, 71, 83}


@pytest.mark.slow
def test_train_eval_predict_on_real_coco_keep_coco_ids_and_the_displayed_frame(tmp_path):
    """dino_tiny of the CPU recipe, 2 steps on the real images (one image with only a crowd region, one
    without objects), then tools/eval.py, tools/predict.py on the val folder (EXIF image included) and on
    the grayscale image, and tools/eval.py on predict.py's results file. 26 s alone, 40 s on two busy shared cores."""
    from cli_runner import run_tools

    root = tmp_path / "coco"
    shutil.copytree(DATA, root, ignore=shutil.ignore_patterns("*.py", "*.md"))
    (root / "annotations" / "instances_train2017.json").write_text(json.dumps(_crowd_only(TRAIN_ANN, CROWD_TRAIN_ID)))
    val_ann, run = root / "annotations" / "instances_val2017.json", tmp_path / "run"
    ckpt = run / "checkpoints" / "last.ckpt"
    cases = [
        {"argv": ["tools/train.py", "fit", "--config", CONFIG, f"--data.init_args.root={root}", TOY_MODEL, *TOY_DATA,
                  "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
                  f"--trainer.default_root_dir={run}"]},
        {"argv": ["tools/eval.py", "--config", CONFIG, f"--data.init_args.root={root}", TOY_MODEL, *TOY_DATA,
                  f"--trainer.default_root_dir={tmp_path / 'eval'}", "--ckpt_path", ckpt, "--output", tmp_path / "stats.json"]},
        {"argv": ["tools/predict.py", "--ckpt_path", ckpt, "--input", root / "val2017", "--output", tmp_path / "pred",
                  "--annotations", val_ann, "--score_threshold", "0", "--device", "cpu"]},
        {"argv": ["tools/predict.py", "--ckpt_path", ckpt, "--input", root / "train2017" / "000000010125.jpg",
                  "--output", tmp_path / "gray", "--score_threshold", "0", "--device", "cpu"]},
        {"argv": ["tools/eval.py", "--annotations", val_ann, "--predictions", tmp_path / "pred" / "predictions.json",
                  "--output", tmp_path / "results_stats.json"]},
    ]
    results = run_tools(cases, tmp_path)
    for case, r in zip(cases, results):
        assert r["code"] == 0, f"{case['argv'][:2]}\n{r['stdout'][-2000:]}\n{r['stderr'][-4000:]}"
    fit = results[0]["stdout"] + results[0]["stderr"]
    assert "not training on 1 annotation(s) with iscrowd=1" in fit and "`max_steps=2` reached" in fit

    ckpt_data = torch.load(ckpt, weights_only=True, map_location="cpu")
    assert ckpt_data["hyper_parameters"]["num_classes"] == 80 and ckpt_data["label_to_cat_id"][79] == 90
    for stats_file in ("stats.json", "results_stats.json"):
        stats = _load(tmp_path / stats_file)
        values = [stats[k] for k in (("map", "map_50", "mar_100") if stats_file == "stats.json" else ("AP", "AP50", "AR_100"))]
        assert all(0.0 <= v <= 1.0 for v in values), stats  # every area has objects here: no -1

    # predictions.json: COCO's image ids (matched by file name) and category ids, boxes in the displayed frame
    preds = _load(tmp_path / "pred" / "predictions.json")
    sizes = {im["id"]: (im["width"], im["height"]) for im in _load(val_ann)["images"]}
    assert {p["image_id"] for p in preds} == set(sizes)
    assert all(sum(p["image_id"] == i for p in preds) >= 20 for i in sizes)  # score_threshold 0: up to 100 each
    cat_ids = {p["category_id"] for p in preds}
    assert cat_ids <= {c["id"] for c in _load(val_ann)["categories"]} and not cat_ids & NOT_COCO_IDS
    assert max(cat_ids) > 80  # only a COCO id can be above the 80 labels
    for p in preds:
        x, y, w, h = p["bbox"]
        width, height = sizes[p["image_id"]]
        assert 0 <= x and 0 <= y and x + w <= width + 0.01 and y + h <= height + 0.01
    exif_boxes = [p["bbox"] for p in preds if p["image_id"] == EXIF_ID]
    assert max(x + w for x, _, w, _ in exif_boxes) > 335  # only possible in the upright 500 x 335 frame
    picture = np.asarray(Image.open(tmp_path / "pred" / "000000013291_exif_orientation6.png").convert("RGB"))
    upright = read_image(DATA / "train2017" / "000000013291.jpg")
    assert picture.shape == upright.shape == (335, 500, 3)
    assert np.median(np.abs(picture.astype(int) - upright.astype(int))) <= 3  # the upright picture, boxes drawn on it

    gray = _load(tmp_path / "gray" / "predictions.json")
    assert gray and all(p["bbox"][0] + p["bbox"][2] <= 640.01 and p["bbox"][1] + p["bbox"][3] <= 436.01 for p in gray)
    assert max(p["bbox"][1] + p["bbox"][3] for p in gray) > 0.5 * 436  # spread over the image, not squeezed in a corner
    assert Image.open(tmp_path / "gray" / "000000010125.png").size == (640, 436)
