"""DDP on CPU (gloo, 2 processes): evaluation gives exactly the single-process numbers.

Every validation set here has an ODD number of images (7), so Lightning's default
``DistributedSampler`` would pad rank 1 with a repeated image. The data modules' eval loaders use
``UnrepeatedDistributedSampler`` (``visiontf.data.samplers.eval_sampler``) and ``CocoMetric``
de-duplicates by image id, so ``tools/eval.py`` on 2 processes must write the same stats as on 1.

To show the comparison can fail, the classification test reruns the 2-process evaluation with the
eval sampler patched out (the "padded" run of ``tests/ddp_utils.py evaluate_runs``):
the padded repeat is then counted twice and top-1 accuracy changes from k/7 to (k + c)/8.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from ddp_utils import ddp_args, evaluate_runs, run

pytestmark = pytest.mark.slow

NUM_VAL = 7  # odd: a repeating sampler must pad one rank


def _assert_same(single: dict, ddp: dict, keys: list[str]) -> None:
    assert keys, "nothing to compare"
    for k in keys:
        assert k in single and k in ddp, f"{k} missing: single={sorted(single)}, ddp={sorted(ddp)}"
        assert math.isclose(single[k], ddp[k], rel_tol=0, abs_tol=1e-6), f"{k}: single {single[k]} != ddp {ddp[k]}"


# -- classification ----------------------------------------------------------------------------------
CLS_CONFIG = "configs/vit/vit_tiny_synthetic.yaml"


def _cls_overrides(root: Path) -> list[str]:
    return [f"--data.init_args.root={root}", "--data.init_args.image_size=32", "--data.init_args.num_workers=0",
            "--data.init_args.batch_size=2",  # 7 images -> batches of 2,2 (rank 0) and 2,1 (rank 1)
            "--model.init_args.model_kwargs={img_size: 32, patch_size: 8, depth: 1, embed_dim: 48, num_heads: 3}"]


@pytest.fixture(scope="module")
def cls_checkpoint(tmp_path_factory) -> tuple[Path, list[str]]:
    from visiontf.tasks.classification.classification_synthetic import make_classification_dataset

    tmp = tmp_path_factory.mktemp("cls")
    root = make_classification_dataset(tmp / "data", num_train=12, num_val=NUM_VAL, num_classes=3, image_size=32)
    overrides = _cls_overrides(root)
    run(["tools/train.py", "fit", "--config", CLS_CONFIG, *overrides, "--trainer.max_epochs=1",
         "--model.init_args.lr=3e-3", f"--trainer.default_root_dir={tmp / 'run'}",
         "--trainer.enable_progress_bar=false"])
    ckpt = tmp / "run" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    return ckpt, overrides


def test_classification_ddp_eval_equals_single_process(cls_checkpoint, tmp_path):
    """Top-1/top-5 on 2 ranks equal 1 rank; with the repeating sampler top-1 differs (the check has teeth)."""
    ckpt, overrides = cls_checkpoint
    stats = evaluate_runs(CLS_CONFIG, ckpt, tmp_path, overrides, runs=("single", "ddp", "padded"))
    single, ddp, padded = stats["single"], stats["ddp"], stats["padded"]
    _assert_same(single, ddp, ["val/acc1", "val/acc5"])

    # k correct of 7: a repeated image makes it (k + c)/8, equal only when k is 0 or 7.
    k = round(single["val/acc1"] * NUM_VAL)
    assert math.isclose(single["val/acc1"], k / NUM_VAL, abs_tol=1e-6)
    assert 0 < k < NUM_VAL, f"model gets {k}/7 right; the repeating-sampler control needs a mixed result"
    assert not math.isclose(padded["val/acc1"], single["val/acc1"], abs_tol=1e-6), (
        "with Lightning's repeating DistributedSampler the 8 scored samples should change top-1; "
        "if they do not, the equality test above could not detect a doubled prediction"
    )
    assert round(padded["val/acc1"] * (NUM_VAL + 1)) in (k, k + 1)


# -- detection ---------------------------------------------------------------------------------------
DET_CONFIG = "configs/detr/detr_tiny_shapes.yaml"


def _det_overrides(root: Path) -> list[str]:
    return [f"--data.init_args.root={root}", "--data.init_args.num_workers=0", "--data.init_args.batch_size=2",
            "--data.init_args.scales=[64]", "--data.init_args.max_size=96", "--data.init_args.crop_scales=[48]",
            "--data.init_args.crop_size=[32, 64]", "--data.init_args.val_size=64",
            "--model.init_args.model_kwargs={arch: {hidden_dim: 32, nheads: 2, enc_layers: 1, dec_layers: 1, "
            "dim_feedforward: 64, num_queries: 10}}",
            "--model.init_args.eval_backend=pycocotools"]


def _prepare_val_split(img_dir: Path, ann_file: Path, size: int = 64) -> None:
    """Resize every val image to ``size`` x ``size`` (boxes scaled) and add one large centred box each.

    Same-size images: a padded batch changes DETR's outputs (the ResNet sees its batch neighbours'
    padding), and 1 process batches images (0,1),(2,3).. while 2 ranks batch (0,2),(4,6) / (1,3),(5).
    (Batch size 1 would avoid padding too, at twice the eval steps.)
    The centred box is what the pinned box head below predicts.
    """
    import json

    from PIL import Image

    data = json.loads(ann_file.read_text())
    scale = {}
    for img in data["images"]:
        path = img_dir / img["file_name"]
        im = Image.open(path).convert("RGB")
        scale[img["id"]] = (size / im.width, size / im.height)
        im.resize((size, size), Image.BILINEAR).save(path, quality=95)
        img["width"] = img["height"] = size
    for a in data["annotations"]:
        sx, sy = scale[a["image_id"]]
        x, y, w, h = a["bbox"]
        a["bbox"] = [x * sx, y * sy, w * sx, h * sy]
        a["area"] = w * sx * h * sy
    next_id = max((a["id"] for a in data["annotations"]), default=0) + 1
    cats = sorted(c["id"] for c in data["categories"])
    for k, img in enumerate(data["images"]):
        w, h = img["width"], img["height"]
        data["annotations"].append({"id": next_id + k, "image_id": img["id"], "category_id": cats[k % len(cats)],
                                    "bbox": [0.1 * w, 0.1 * h, 0.8 * w, 0.8 * h], "area": 0.64 * w * h, "iscrowd": 0})
    ann_file.write_text(json.dumps(data))


def _pin_box_head(ckpt_path: Path, out: Path) -> Path:
    """A copy of the checkpoint whose boxes are all near the centred 80 % box (sigmoid(log 4) = 0.8).

    After two steps DETR scores exactly 0 on every COCO stat, and 0 == 0 would hide a lost or
    doubled image. With boxes pinned (small per-query jitter kept) each image contributes true and
    false positives ranked by its own class scores, so every image moves mAP/mAR.
    """
    import torch

    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    sd = ckpt["state_dict"]
    sd["model.bbox_embed.layers.2.weight"] = sd["model.bbox_embed.layers.2.weight"] * 0.05
    sd["model.bbox_embed.layers.2.bias"] = torch.tensor([0.0, 0.0, math.log(4), math.log(4)])
    torch.save(ckpt, out)
    return out


@pytest.fixture(scope="module")
def det_ddp_fit(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """A 2-process CPU DDP ``fit`` of the tiny DETR (1 epoch, 2 optimizer steps): last.ckpt, eval ckpt, overrides."""
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    tmp = tmp_path_factory.mktemp("det")
    paths = make_detection_dataset(tmp / "data", num_train=8, num_val=NUM_VAL, image_size=(64, 64), num_classes=2)
    _prepare_val_split(paths["val_images"], paths["val_ann"])
    overrides = _det_overrides(paths["root"])
    run(["tools/train.py", "fit", "--config", DET_CONFIG, *overrides, *ddp_args(), "--trainer.max_epochs=1",
         "--trainer.limit_train_batches=2", "--trainer.check_val_every_n_epoch=1", "--model.init_args.warmup_steps=0",
         "--checkpoint.monitor=null", "--checkpoint.mode=min", f"--trainer.default_root_dir={tmp / 'run'}",
         "--trainer.enable_progress_bar=false"])
    last = tmp / "run" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    return last, _pin_box_head(last, tmp / "eval.ckpt"), overrides


def test_detection_ddp_fit_writes_last_checkpoint(det_ddp_fit):
    import torch

    ckpt_path, _, _ = det_ddp_fit
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 2  # 8 images / (2 ranks x batch 2) = 2 batches per rank, limited to 2
    assert ckpt["hyper_parameters"]["num_classes"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())


def test_detection_ddp_eval_equals_single_process(det_ddp_fit, tmp_path):
    """COCO stats and the per-class numbers (``--per_class``) on 2 ranks equal 1 rank, with the unrepeated
    sampler and with the repeating one (de-dup)."""
    from visiontf.tasks.detection.coco_metric import METRIC_NAMES

    _, ckpt, overrides = det_ddp_fit
    overrides = [*overrides, "--per_class"]
    keys = [f"val/{k}" for k in METRIC_NAMES]
    stats = evaluate_runs(DET_CONFIG, ckpt, tmp_path, overrides, runs=("single", "ddp", "padded"))
    single, ddp, padded = stats["single"], stats["ddp"], stats["padded"]
    assert 0 < single["val/map"] < 1 and 0 < single["val/mar_100"] < 1, f"degenerate stats prove nothing: {single}"
    assert len(single["per_class"]) == 2 and any(0 < r["AP"] < 1 for r in single["per_class"]), single["per_class"]
    _assert_same(single, ddp, keys)
    _same_rows(single, ddp)
    _assert_same(single, padded, keys)
    _same_rows(single, padded)


def _same_rows(single: dict, other: dict) -> None:
    """The per-class rows of two ``tools/eval.py --per_class`` runs agree to 1e-6 (names and counts exactly)."""
    assert len(single["per_class"]) == len(other["per_class"])
    for a, b in zip(single["per_class"], other["per_class"]):
        assert (a["name"], a["num_gt"]) == (b["name"], b["num_gt"])
        for k in ("AP", "AP50", "AP75", "AR100"):
            assert math.isclose(a[k], b[k], rel_tol=0, abs_tol=1e-6), f"{a['name']} {k}: single {a[k]} != {b[k]}"


def test_duplicate_detections_change_coco_map_unless_deduplicated(tmp_path):
    """Why de-dup matters: a padded repeat's detections, scored twice, are false positives for COCOeval.

    Perfect detections of 7 images give mAP 1. Scoring one image's detections twice (what a
    repeating sampler does without de-dup) lowers it; CocoMetric fed the same repeat keeps 1.
    """
    import json

    import torch

    from visiontf.evaluation.coco import evaluate_coco
    from visiontf.tasks.detection.coco_metric import CocoMetric
    from visiontf.tasks.detection.detection_synthetic import make_detection_dataset

    paths = make_detection_dataset(tmp_path, num_train=0, num_val=NUM_VAL, image_size=(64, 64), num_classes=2)
    gt = json.loads(paths["val_ann"].read_text())
    cats = sorted(c["id"] for c in gt["categories"])
    per_image = {img["id"]: [] for img in gt["images"]}
    for a in gt["annotations"]:
        per_image[a["image_id"]].append(a)
    results = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.9}
               for a in gt["annotations"]]
    first = next(i for i, anns in per_image.items() if anns)
    doubled = results + [r for r in results if r["image_id"] == first]
    clean_ap = evaluate_coco(paths["val_ann"], results, backend="pycocotools")["AP"]
    doubled_ap = evaluate_coco(paths["val_ann"], doubled, backend="pycocotools")["AP"]
    assert clean_ap == pytest.approx(1.0)
    assert doubled_ap < clean_ap - 1e-3

    def pred(anns):
        xywh = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        return {"boxes": torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1), "scores": torch.full((len(anns),), 0.9),
                "labels": torch.tensor([cats.index(a["category_id"]) for a in anns], dtype=torch.int64)}

    metric = CocoMetric(paths["val_ann"], cats, backend="pycocotools")
    ids = list(per_image)
    metric.update([pred(per_image[i]) for i in ids], ids)
    metric.update([pred(per_image[first])], [first])  # the padded repeat
    assert float(metric.compute()["map"]) == pytest.approx(clean_ap, abs=1e-6)


def test_set_criterion_averages_num_boxes_over_ranks(monkeypatch):
    """DETR divides box losses by the all-reduced box count / world size (the original's normaliser).

    A fake 2-rank group: all_reduce adds the other rank's 6 boxes. Rank 0 has 2 boxes, so the
    normaliser must be (2 + 6) / 2 = 4, not its local 2.
    """
    import torch

    import visiontf.set_prediction.criterion as crit
    from visiontf.set_prediction import HungarianMatcher, SetCriterion

    calls = []

    def fake_all_reduce(t, op=None, **kw):
        calls.append(float(t))
        t += 6.0

    monkeypatch.setattr(crit, "_world_size", lambda: 2)
    monkeypatch.setattr(crit.dist, "all_reduce", fake_all_reduce)
    targets = [{"labels": torch.tensor([0, 1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.3, 0.3, 0.1, 0.2]])}]
    criterion = SetCriterion(2, HungarianMatcher(), weight_dict={"loss_ce": 1, "loss_bbox": 5, "loss_giou": 2}, eos_coef=0.1)
    assert criterion.num_boxes(targets, torch.device("cpu")) == 4.0
    assert calls == [2.0]
    outputs = {"pred_logits": torch.randn(1, 5, 3), "pred_boxes": torch.rand(1, 5, 4) * 0.5 + 0.25}
    distributed = criterion(outputs, targets)
    monkeypatch.setattr(crit, "_world_size", lambda: 1)
    local = criterion(outputs, targets)
    # same matches, box losses divided by 4 instead of 2
    torch.testing.assert_close(distributed["loss_bbox"] * 2, local["loss_bbox"])
    torch.testing.assert_close(distributed["loss_giou"] * 2, local["loss_giou"])
    torch.testing.assert_close(distributed["loss_ce"], local["loss_ce"])  # CE is a weighted mean, no num_boxes


def test_detection_eval_step_runs_no_collective(monkeypatch):
    """Eval steps under DDP must not call collectives: ``UnrepeatedDistributedSampler`` gives 7 images
    with batch 1 as 4 batches on rank 0 and 3 on rank 1, so rank 0's 4th all_reduce never finds a partner."""
    import torch

    import visiontf.set_prediction.criterion as crit
    from visiontf.tasks.detection.detection_task import DetectionTask

    def forbidden(*a, **k):
        raise RuntimeError("collective op in an eval step")

    monkeypatch.setattr(crit, "_world_size", lambda: 2)
    monkeypatch.setattr(crit.dist, "all_reduce", forbidden)
    task = DetectionTask("detr_tiny", 2, model_kwargs={"arch": {"hidden_dim": 32, "nheads": 2, "enc_layers": 1, "dec_layers": 1,
                                                                "dim_feedforward": 64, "num_queries": 5}}).eval()
    monkeypatch.setattr(task, "_metric", lambda stage: type("M", (), {"update": lambda self, *a: None})())
    target = {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]]), "image_id": 1,
              "orig_size": torch.tensor([32, 32]), "size": torch.tensor([32, 32])}
    with torch.no_grad():
        task.validation_step((torch.randn(1, 3, 32, 32), torch.zeros(1, 32, 32, dtype=torch.bool), [target]), 0)


# -- segmentation ------------------------------------------------------------------------------------
SEG_CONFIG = "configs/setr/setr_tiny_synthetic.yaml"


def test_segmentation_ddp_eval_equals_single_process(tmp_path):
    """mIoU, mAcc, aAcc and every per-class IoU on 2 ranks equal 1 rank (same-size images: no batch padding)."""
    from visiontf.tasks.segmentation.segmentation_synthetic import make_segmentation_dataset

    root = make_segmentation_dataset(tmp_path / "data", num_train=2, num_val=NUM_VAL, num_classes=4, image_size=(64, 64))
    # num_classes null: classes.txt decides (Lightning's merge of the task's and the data's hyper-parameters refused it)
    overrides = [f"--data.init_args.root={root}", "--data.init_args.num_workers=0", "--data.init_args.batch_size=2",
                 "--data.init_args.num_classes=null", "--data.init_args.val_batch_size=2", "--data.init_args.crop_size=32",
                 "--data.init_args.base_size=[64, 64]",
                 "--model.init_args.model_kwargs={img_size: 32, drop_path_rate: 0.0, "
                 "encoder_kwargs: {patch_size: 8, depth: 4, embed_dim: 48, num_heads: 3}}",
                 "--model.init_args.crop_size=32", "--model.init_args.stride=32"]
    run(["tools/train.py", "fit", "--config", SEG_CONFIG, *overrides, "--trainer.max_epochs=1",
         "--trainer.limit_val_batches=0", "--model.init_args.warmup_steps=0", "--checkpoint.monitor=null",
         f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.enable_progress_bar=false"])
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    stats = evaluate_runs(SEG_CONFIG, ckpt, tmp_path, overrides)
    single, ddp = stats["single"], stats["ddp"]
    per_class = sorted(k for k in single if k.startswith("val/IoU_"))
    assert len(per_class) == 4, sorted(single)
    assert 0 < single["val/mIoU"] < 1, single
    _assert_same(single, ddp, ["val/mIoU", "val/mAcc", "val/aAcc", *per_class])
