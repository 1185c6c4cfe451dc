"""Class index = COCO category id (``CocoDataModule(label_space="category_id")``), as the original DETR,
Deformable DETR and DINO train: their published checkpoints have 91 outputs (92 for DETR, with "no
object") indexed by category id, and evaluate on COCO only in that space. Checked on the real COCO
images of tests/fixtures/coco_real (80 categories, ids up to 90)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from test_coco_real import DATA, VAL_ANN, _detections_on_truth, _load

from visiontf.data.transforms import detection as DT
from visiontf.evaluation.coco import CocoEvalError
from visiontf.tasks.detection.coco_annotations import AnnotationError
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.coco_dataset import CocoDetection
from visiontf.tasks.detection.coco_metric import CocoMetric

#: ids COCO skips within 1..90, and 0: classes of a 91-output head that never occur
GAPS = (0, 12, 26, 29, 30, 45, 66, 68, 69, 71, 83)


def _pycocotools(gt: dict, dets: list[dict]) -> list[float]:
    coco = COCO()
    coco.dataset = gt
    coco.createIndex()
    ev = COCOeval(coco, coco.loadRes(dets), "bbox")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return [float(s) for s in ev.stats]


def test_labels_are_the_category_ids_with_91_outputs():
    dm = CocoDataModule(DATA, num_workers=0, label_space="category_id")
    cats = {c["id"]: c["name"] for c in _load(VAL_ANN)["categories"]}
    assert dm.num_classes == 91 == max(cats) + 1
    assert dm.label_to_cat_id == {c: c for c in cats} == dm.cat_id_to_label
    assert [dm.class_names[c] for c in cats] == list(cats.values())
    assert {dm.class_names[g] for g in GAPS} == {"N/A"} and len(dm.class_names) == 91
    ds = CocoDetection(DATA / "val2017", VAL_ANN, DT.build_val_transforms(96, 160), label_space="category_id")
    anns = _load(VAL_ANN)["annotations"]
    for pos, image in enumerate(ds.index.images):
        truth = sorted(a["category_id"] for a in anns if a["image_id"] == image["id"] and not a["iscrowd"])
        assert sorted(ds[pos][1]["labels"].tolist()) == truth
    # the default numbers the 80 categories 0..79, the same annotations
    contiguous = CocoDataModule(DATA, num_workers=0)
    assert contiguous.num_classes == 80 and contiguous.label_to_cat_id[79] == 90


def test_metric_scores_category_id_labels_as_pycocotools_and_counts_the_gap_classes():
    gt = _load(VAL_ANN)
    dets = _detections_on_truth(gt)
    ref = _pycocotools(gt, dets)
    assert 0.3 < ref[0] < 0.95
    l2c = {c["id"]: c["id"] for c in gt["categories"]}
    gap_dets = [{**d, "category_id": GAPS[i % len(GAPS)], "score": 0.99} for i, d in enumerate(dets[:7])]

    def metric(num_classes, extra):
        m = CocoMetric(VAL_ANN, l2c, backend="pycocotools", num_classes=num_classes)
        for im in gt["images"]:
            mine = [d for d in dets + extra if d["image_id"] == im["id"]]
            boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (d["bbox"] for d in mine)], dtype=torch.float64)
            m.update([{"boxes": boxes.reshape(-1, 4), "scores": torch.tensor([d["score"] for d in mine]),
                       "labels": torch.tensor([d["category_id"] for d in mine])}], [im["id"]])
        return m

    m = metric(91, gap_dets)
    # the gap classes are not scored, as COCOeval scores only the file's categories; everything else is
    assert [float(v) for v in m.compute().values()] == pytest.approx(ref, abs=1e-4)
    assert m.last_unmapped == len(gap_dets)
    with pytest.raises(CocoEvalError, match=r"label\(s\) \[0, 12"):  # without the head's size: an error, as before
        metric(None, gap_dets).compute()
    with pytest.raises(CocoEvalError, match=r"label\(s\) \[91\]"):  # outside the head: still an error
        metric(91, [{**dets[0], "category_id": 91}]).compute()


def test_unusable_category_ids_and_label_spaces_are_refused(tmp_path):
    root = tmp_path / "coco"
    shutil.copytree(DATA, root, ignore=shutil.ignore_patterns("*.py", "*.md"))
    for split in ("train2017", "val2017"):
        path = root / "annotations" / f"instances_{split}.json"
        data = _load(path)
        for c in data["categories"]:
            c["id"] = c["id"] * 1000 if c["id"] == 90 else c["id"]
        for a in data["annotations"]:
            a["category_id"] = a["category_id"] * 1000 if a["category_id"] == 90 else a["category_id"]
        path.write_text(json.dumps(data))
    with pytest.raises(AnnotationError, match=r"category id\(s\) \[90000\] cannot be class indices.*label_space contiguous"):
        CocoDataModule(root, num_workers=0, label_space="category_id")
    assert CocoDataModule(root, num_workers=0).num_classes == 80  # contiguous takes any ids
    with pytest.raises(AnnotationError, match="label_space 'coco91'"):
        CocoDataModule(DATA, num_workers=0, label_space="coco91")


@pytest.mark.slow
def test_published_91_class_weights_evaluate_with_their_heads_through_tools_eval(tmp_path):
    """A dino_tiny with COCO's 91 classes, as a published checkpoint has them, evaluated by tools/eval.py
    with ``label_space: category_id``: every weight loads (nothing re-initialised), and its predicted
    class is scored as the category id. The ground truth is made of the model's own detections (every
    detection of a real category, the predicted class as its id, computed here image by image), so the
    stats are 1.0 only if eval.py runs the same weights and reads each class index as that category id."""
    from cli_runner import run_tools
    from deformable_helpers import randomize
    from safetensors.torch import save_file
    from test_coco_real import CONFIG, TOY_DATA

    from visiontf import create_model
    from visiontf.set_prediction import build_postprocess

    kwargs = dict(arch=dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=2, dim_feedforward=32, num_queries=12),
                  dino=dict(num_denoising=6, num_query_groups=2), postprocess=dict(nms_iou_threshold=0.7, nms_class_agnostic=False))
    torch.manual_seed(0)
    model = create_model("dino_tiny", num_classes=91, **kwargs).eval()
    randomize(model)
    weights = tmp_path / "dino_tiny_coco91.safetensors"
    save_file({k: v.clone().contiguous() for k, v in model.state_dict().items()}, str(weights))

    root = tmp_path / "coco"
    shutil.copytree(DATA, root, ignore=shutil.ignore_patterns("*.py", "*.md"))
    val = _load(VAL_ANN)
    cats = {c["id"] for c in val["categories"]}
    ds = CocoDetection(DATA / "val2017", VAL_ANN, DT.build_val_transforms(96, 160), label_space="category_id")
    post, truth, gaps = build_postprocess(model), [], 0
    with torch.no_grad():
        for pos in range(len(ds)):
            image, target = ds[pos]
            out = model(image[None], torch.zeros(1, *image.shape[1:], dtype=torch.bool))
            (pred,) = post(out, target["orig_size"][None])
            mine = [(s, b, c) for s, b, c in zip(pred["scores"].tolist(), pred["boxes"].tolist(), pred["labels"].tolist())]
            gaps += sum(c not in cats for _, _, c in mine)
            for _, (x0, y0, x1, y1), c in (m for m in mine if m[2] in cats):
                truth.append({"id": len(truth) + 1, "image_id": int(target["image_id"]), "category_id": c, "iscrowd": 0,
                              "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)})
    assert gaps > 0  # random class heads predict the N/A classes too: what the metric must leave out
    # an id above 79 can only be scored as itself: a contiguous reading would be out of range
    assert len({t["category_id"] for t in truth}) >= 2 and max(t["category_id"] for t in truth) > 79
    (root / "annotations" / "instances_val2017.json").write_text(json.dumps({**val, "annotations": truth}))

    toy_model = "--model.init_args.model_kwargs={" + ", ".join(f"{k}: {str(v).lower()}" for k, v in kwargs.items()) + "}"
    argv = ["tools/eval.py", "--config", CONFIG, f"--data.init_args.root={root}", toy_model, *TOY_DATA,
            "--data.init_args.label_space=category_id", f"--model.init_args.pretrained={weights}",
            "--data.init_args.val_batch_size=1", f"--trainer.default_root_dir={tmp_path / 'eval'}",
            "--output", str(tmp_path / "stats.json")]
    (r,) = run_tools([{"argv": argv}], tmp_path)
    log = r["stdout"] + r["stderr"]
    assert r["code"] == 0, log[-4000:]
    assert "re-initialised" not in log and "91 outputs" in log and "with no category" in log
    stats = _load(tmp_path / "stats.json")
    assert stats["map"] == pytest.approx(1.0, abs=1e-6) and stats["mar_100"] == pytest.approx(1.0, abs=1e-6), stats
