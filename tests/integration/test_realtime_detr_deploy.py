"""RT-DETR and D-FINE deployed as a user does it: fine-tuned from weights with COCO's 80 classes
to a set whose category ids are 3, 7 and 12 (neither 0/1-based nor contiguous), exported with a dynamic ONNX
graph, evaluated through the same COCO evaluator with PyTorch and with onnxruntime (``tools/eval.py --onnx``),
and predicted with the original ids written back."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from cli_runner import run_tools
from handmade_data import CATEGORIES, TINY_COCO_RUN, make_dataset
from safetensors.torch import save_file

from visiontf.models import create_model, get_entry

CONFIGS = {"rtdetr_tiny": "configs/rtdetr/rtdetr_tiny_shapes.yaml", "dfine_tiny": "configs/dfine/dfine_tiny_shapes.yaml"}
#: the hand-made set's COCO layout (tests/handmade_data.py), for the shapes configs' CocoDataModule
LAYOUT = ["--data.init_args.train_images=images/train", "--data.init_args.val_images=images/val",
          "--data.init_args.train_ann=annotations/train.json", "--data.init_args.val_ann=annotations/val.json"]
#: one process, float32, no EMA warm-up to speak of, batch 1 at evaluation (no padding between images)
CPU = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.precision=32-true",
       "--data.init_args.val_batch_size=1", "--data.init_args.scale_per_batch=false"]

#: the size the predictor of the checkpoint uses (TINY_COCO_RUN's), not the config's 224
EVAL_SIZE = ["--data.init_args.val_size=64", "--data.init_args.max_size=96"]


def _small(name: str) -> dict:
    """The registry's test settings (narrow backbone, d 32, 3 decoder layers) with 10 queries."""
    kwargs = dict(get_entry(name).test_kwargs)
    kwargs["decoder"] = {**kwargs["decoder"], "num_queries": 10}
    kwargs["num_select"] = 10
    return json.loads(json.dumps(kwargs))  # tuples as lists, as a config gives them


def _self_truth(ckpt, data, out):
    """``data`` with its validation truth replaced by the checkpoint's own detections (PyTorch, batch 1; its best 5 per image), under the
    ids the checkpoint maps its labels to: a few-step model then scores near 1 against it, so an export that moved
    boxes or scores would lose AP, which it could not against the real truth of a model that scores ~0."""
    from visiontf.inference.predictor import Predictor

    shutil.copytree(data, out)
    ann_file = out / "annotations" / "val.json"
    ann = json.loads(ann_file.read_text())
    predictor = Predictor.from_checkpoint(ckpt, device="cpu", batch_size=1)
    results = predictor([out / "images" / "val" / im["file_name"] for im in ann["images"]], score_threshold=0.0, top_k=5)
    ann["annotations"] = []
    for im, r in zip(ann["images"], results):
        for (x0, y0, x1, y1), label in zip(r["boxes"].tolist(), r["labels"].tolist()):
            ann["annotations"].append({"id": len(ann["annotations"]) + 1, "image_id": im["id"], "iscrowd": 0,
                                       "category_id": predictor.label_to_cat_id[label], "bbox": [x0, y0, x1 - x0, y1 - y0],
                                       "area": (x1 - x0) * (y1 - y0)})
    assert ann["annotations"], "the model detects something to take as truth"
    ann_file.write_text(json.dumps(ann))
    return out


@pytest.mark.slow
def test_finetune_to_noncontiguous_ids_export_and_onnx_map_equals_pytorch(tmp_path):
    data = make_dataset(tmp_path / "data", "coco", num_train=4, num_val=3)
    fits = []
    for name, config in CONFIGS.items():
        torch.manual_seed(0)
        coco = tmp_path / f"{name}_coco.safetensors"
        save_file({k: v.contiguous() for k, v in create_model(name, num_classes=80, **_small(name)).state_dict().items()}, str(coco))
        out = tmp_path / name
        fits.append({"argv": ["tools/train.py", "fit", "--config", config, "--data.init_args.root", data, *LAYOUT, *TINY_COCO_RUN, *CPU,
                              f"--model.init_args.model_kwargs={json.dumps(_small(name))}", "--model.init_args.pretrained", coco,
                              "--trainer.default_root_dir", out]})
        fits.append({"argv": ["tools/export.py", "--ckpt_path", out / "checkpoints" / "last.ckpt", "--output", out / "model.safetensors",
                              "--onnx", out / "model.onnx", "--image_size", "64", "64"]})
    results = run_tools(fits, tmp_path, timeout=900)
    for case, r in zip(fits, results):
        assert r["code"] == 0, f"{' '.join(map(str, case['argv']))}\n{r['stdout'][-2000:]}\n{r['stderr'][-4000:]}"
    ids = {i: c for i, c in enumerate(sorted(CATEGORIES))}  # {0: 3, 1: 7, 2: 12}
    evals = []
    for name, config in CONFIGS.items():
        out = tmp_path / name
        ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
        assert ckpt["hyper_parameters"]["num_classes"] == 3 and ckpt["label_to_cat_id"] == ids
        truth = _self_truth(out / "checkpoints" / "last.ckpt", data, tmp_path / f"{name}_truth")
        common = ["tools/eval.py", "--config", config, "--data.init_args.root", truth, *LAYOUT, *CPU, *EVAL_SIZE,
                  f"--model.init_args.model_kwargs={json.dumps(_small(name))}", "--ckpt_path", out / "checkpoints" / "last.ckpt", "--quiet"]
        evals += [{"argv": [*common, "--output", out / "torch.json"]},
                  {"argv": [*common, "--onnx", out / "model.onnx", "--output", out / "onnx.json"]},
                  {"argv": ["tools/predict.py", "--weights", out / "model.safetensors", "--input", data / "images" / "val",
                            "--output", out / "pred", "--annotations", data / "annotations" / "val.json", "--score_threshold", "0.0",
                            "--device", "cpu"]}]
    results = run_tools(evals, tmp_path, timeout=900)
    for case, r in zip(evals, results):
        assert r["code"] == 0, f"{' '.join(map(str, case['argv']))}\n{r['stdout'][-2000:]}\n{r['stderr'][-4000:]}"
    for name in CONFIGS:
        out = tmp_path / name
        pt, ort = (json.loads((out / f"{k}.json").read_text()) for k in ("torch", "onnx"))
        assert pt["val/mAP"] > 0.2, (name, pt["val/mAP"])  # its own detections (near-tied scores): far from 0, something to lose
        assert abs(ort["val/mAP"] - pt["val/mAP"]) <= 1e-3, (name, pt["val/mAP"], ort["val/mAP"])  # within 0.1 AP
        preds = json.loads((out / "pred" / "predictions.json").read_text())
        assert preds and {p["category_id"] for p in preds} <= set(CATEGORIES)
