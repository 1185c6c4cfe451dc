"""Detection task end to end: training steps, and validation mAP equal to plain pycocotools."""
import json

import lightning as L
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import nn

from visiontf.models.contract import Detector
from visiontf.tasks.detection.coco_data import CocoDataModule
from visiontf.tasks.detection.detection_synthetic import make_detection_dataset
from visiontf.tasks.detection.detection_task import DetectionTask

TINY_DETR = {"arch": {"hidden_dim": 32, "nheads": 2, "enc_layers": 1, "dec_layers": 2, "dim_feedforward": 64, "num_queries": 8}}
SIZES = {"scales": [64, 80], "max_size": 112, "crop_scales": [64], "crop_size": [48, 64], "val_size": 72}


@pytest.fixture(scope="module")
def det_root(tmp_path_factory):
    return make_detection_dataset(tmp_path_factory.mktemp("det"), num_train=8, num_val=5, image_size=(64, 88), seed=1)["root"]


def _datamodule(root, **kw):
    return CocoDataModule(root, batch_size=2, val_batch_size=2, num_workers=0, **SIZES, **kw)


def _trainer(tmp_path, **kw):
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=tmp_path, **kw)


def test_training_steps_run_and_log_every_loss_term(det_root, tmp_path):
    dm = _datamodule(det_root)
    task = DetectionTask(num_classes=dm.num_classes, model_kwargs=TINY_DETR, lr=1e-3, lr_backbone=1e-4, schedule="constant")
    trainer = _trainer(tmp_path, max_steps=3, limit_val_batches=0, gradient_clip_val=0.1)
    first = [p.detach().clone() for p in task.model.parameters() if p.requires_grad]
    trainer.fit(task, datamodule=dm)
    metrics = trainer.callback_metrics
    for key in ("train/loss", "train/loss_ce", "train/loss_bbox", "train/loss_giou", "train/cardinality_error", "train_aux/loss_ce_0"):
        assert key in metrics and torch.isfinite(metrics[key])
    moved = [not torch.equal(a, b) for a, b in zip(first, (p for p in task.model.parameters() if p.requires_grad))]
    assert any(moved)
    # the backbone gets its own (smaller) learning rate
    groups = trainer.optimizers[0].param_groups
    assert sorted(g["lr"] for g in groups) == [1e-4, 1e-3]


class OracleDETR(Detector):
    """Predicts each image's ground-truth boxes (jittered) with confident logits: a non-trivial mAP."""

    def __init__(self, num_classes, num_queries=8):
        super().__init__()
        self.num_classes, self.num_queries = num_classes, num_queries
        self.targets = None
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, images, mask=None):
        B, Q, K = images.shape[0], self.num_queries, self.num_classes
        logits = torch.full((B, Q, K + 1), -4.0)
        logits[..., K] = 4.0
        boxes = torch.full((B, Q, 4), 0.5)
        g = torch.Generator().manual_seed(0)
        for b, t in enumerate(self.targets):
            n = min(len(t["labels"]), Q)
            jitter = 1 + 0.15 * (torch.rand(n, 4, generator=g) - 0.5)
            boxes[b, :n] = (t["boxes"][:n] * jitter).clamp(0, 1)
            logits[b, torch.arange(n), t["labels"][:n]] = 4.0 + torch.rand(n, generator=g)
            logits[b, :n, K] = 0.0
        return {"pred_logits": logits + self.dummy, "pred_boxes": boxes}


class OracleTask(DetectionTask):
    def _forward(self, images, mask, targets):  # training and evaluation steps both forward through here
        self.model.targets = targets
        return super()._forward(images, mask, targets)

    def predict_step(self, batch, batch_idx):
        self.model.targets = batch[2]
        return super().predict_step(batch, batch_idx)


def test_validation_map_equals_pycocotools_on_the_original_annotations(det_root, tmp_path):
    dm = _datamodule(det_root)
    task = OracleTask(num_classes=dm.num_classes, model_kwargs=TINY_DETR)
    task.model = OracleDETR(dm.num_classes)
    trainer = _trainer(tmp_path)
    trainer.validate(task, datamodule=dm, verbose=False)
    ours = task.eval_report()
    assert 0.2 < ours["map"] < 0.99  # non-trivial: the jitter costs some AP

    # the same predictions, scored by plain pycocotools on the original annotation file
    preds = [p for batch in trainer.predict(task, datamodule=dm) for p in batch]
    results = [
        {"image_id": p["image_id"], "category_id": dm.label_to_cat_id[int(l)], "score": float(s),
         "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]}
        for p in preds for b, s, l in zip(p["boxes"], p["scores"], p["labels"])
    ]
    gt = COCO(str(dm.val_ann_file))
    ev = COCOeval(gt, gt.loadRes(results), "bbox")
    ev.params.imgIds = sorted(p["image_id"] for p in preds)
    ev.evaluate(), ev.accumulate(), ev.summarize()
    names = ["map", "map_50", "map_75", "map_small", "map_medium", "map_large",
             "mar_1", "mar_10", "mar_100", "mar_small", "mar_medium", "mar_large"]
    for name, ref in zip(names, ev.stats):
        assert ours[name] == pytest.approx(ref, abs=1e-6), name
    assert "Average Precision" in ours["table"]
    # boxes come back in ORIGINAL image pixels: they lie inside each image's own size
    sizes = {im["id"]: (im["width"], im["height"]) for im in json.loads(dm.val_ann_file.read_text())["images"]}
    for p in preds:
        w, h = sizes[p["image_id"]]
        assert p["boxes"][:, 2].max() <= w + 1e-3 and p["boxes"][:, 3].max() <= h + 1e-3


def test_checkpoint_carries_class_names_for_the_predictor(det_root, tmp_path, capsys):
    from visiontf.inference.predictor import Predictor

    dm = _datamodule(det_root)
    task = DetectionTask(num_classes=dm.num_classes, model_kwargs=TINY_DETR)
    trainer = _trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(task, datamodule=dm)
    path = tmp_path / "t.ckpt"
    trainer.save_checkpoint(path)
    predictor = Predictor.from_checkpoint(path)
    assert predictor.class_names == dm.class_names
    assert predictor.label_to_cat_id == {int(k): v for k, v in dm.label_to_cat_id.items()}
    # each detection carries its dataset category id beside its label (the table saved with the checkpoint)
    image = torch.rand(3, 64, 80)
    result = predictor(image, score_threshold=None)[0]
    assert len(result["labels"]) > 0
    assert result["category_ids"].tolist() == [predictor.label_to_cat_id[int(label)] for label in result["labels"]]
    predictor.label_to_cat_id = None  # a model without a table: no ids are made up
    assert "category_ids" not in predictor(image, score_threshold=None)[0]
    # tools/predict.py --annotations with a file whose category ids are not the model's: refused, as eval refuses them
    import json as _json

    from visiontf.cli import predict_main

    data = _json.loads(dm.val_ann_file.read_text())
    shift = {c["id"]: c["id"] + 10 for c in data["categories"]}
    data["categories"] = [{**c, "id": shift[c["id"]]} for c in data["categories"]]
    data["annotations"] = [{**a, "category_id": shift[a["category_id"]]} for a in data["annotations"]]
    renumbered = tmp_path / "renumbered.json"
    renumbered.write_text(_json.dumps(data))
    images = str(dm.val_ann_file.parents[1] / "val2017")
    argv = ["--ckpt_path", str(path), "--input", images, "--output", str(tmp_path / "pred"), "--quiet"]
    capsys.readouterr()
    assert predict_main([*argv, "--annotations", str(renumbered)]) == 2
    assert "renumbered.json: the model predicts categories the file does not list as such" in capsys.readouterr().err
    assert not (tmp_path / "pred" / "predictions.json").exists()
    assert predict_main([*argv, "--annotations", str(dm.val_ann_file)]) == 0
    written = _json.loads((tmp_path / "pred" / "predictions.json").read_text())
    assert {d["category_id"] for d in written} <= set(dm.label_to_cat_id.values())
