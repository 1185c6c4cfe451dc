"""Command lines behind ``tools/predict.py`` and ``tools/export.py``: a model from a checkpoint or an
export, then the task's adapter does the rest (pictures, ``predictions.json``, attention, ONNX)."""
from __future__ import annotations

import argparse
import importlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from visiontf.adapters.base import canonical_cfg
from visiontf.adapters.detection import coco_results
from visiontf.checkpoints import config_checkpoint_dir, legacy_eval_cfg, load_checkpoint_model, resolve_checkpoint
from visiontf.inference.predict_files import predict_to_folder
from visiontf.inference.predictor import Predictor

log = logging.getLogger(__name__)

_DATA_MODULES = ("visiontf.data.coco", "visiontf.data.classification", "visiontf.data.segmentation")


# ---------------------------------------------------------------------------------------- config
def datamodule_from_config(config: str | Path) -> tuple[Any | None, dict[str, Any]]:
    """Instantiate the YAML's ``data`` section (for class names and category ids) and return its init args.

    Returns ``(None, init_args)`` with a warning when the data module cannot be built (data moved).
    """
    import yaml

    cfg = yaml.safe_load(Path(config).read_text()) or {}
    data = cfg.get("data") or {}
    class_path = data.get("class_path")
    init_args = dict(data.get("init_args") or {})
    if not class_path:
        return None, init_args
    try:
        if "." in class_path:
            mod, name = class_path.rsplit(".", 1)
            cls = getattr(importlib.import_module(mod), name)
        else:
            cls = next(getattr(importlib.import_module(m), class_path) for m in _DATA_MODULES
                       if hasattr(importlib.import_module(m), class_path))
        return cls(**init_args), init_args
    except Exception as e:  # noqa: BLE001 - the data is optional for prediction
        log.warning("%s: could not build the data module %s (%s: %s); class names come from the checkpoint or "
                    "fall back to class_<i>", config, class_path, type(e).__name__, e)
        return None, init_args


def build_predictor(args: argparse.Namespace) -> Predictor:
    """A Predictor from ``--weights`` or ``--ckpt_path`` (+ ``--config`` for class names and category ids).

    Preprocessing: the settings saved with the checkpoint or export; what the ``--config`` data section
    sets explicitly on top (read by :func:`visiontf.checkpoints.legacy_eval_cfg`); command-line options last.
    """
    overrides: dict[str, Any] = {}
    for key in ("min_size", "max_size", "batch_size", "device", "num_workers"):
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    if getattr(args, "seg_mode", None):
        overrides["seg_mode"] = args.seg_mode
    dm, dm_args = (None, {})
    if getattr(args, "config", None):
        dm, dm_args = datamodule_from_config(args.config)
    names = getattr(dm, "class_names", None)
    l2c = getattr(dm, "label_to_cat_id", None)
    if l2c:
        overrides["label_to_cat_id"] = l2c
    if args.weights:
        return Predictor.from_file(args.weights, class_names=names, **overrides)
    if not args.ckpt_path:
        raise SystemExit("give --weights model.safetensors, or --ckpt_path K.ckpt (optionally with --config C.yaml)")
    model, info = load_checkpoint_model(resolve_checkpoint(args.ckpt_path, config_checkpoint_dir(args.config)))
    preprocess = {**info.get("preprocess", {}), **legacy_eval_cfg(dm_args)}
    return Predictor(model, class_names=names if names is not None else info.get("class_names"), preprocess=preprocess,
                     **overrides)


# ---------------------------------------------------------------------------------------- predict
def predict_main(argv: Sequence[str] | None = None) -> int:
    """``tools/predict.py``: annotated images, ``predictions.json`` and optional attention pictures."""
    p = argparse.ArgumentParser(description="Predict with a visiontf checkpoint or exported model.")
    p.add_argument("--config", help="training YAML (class names, category ids and eval preprocessing from its data section)")
    p.add_argument("--ckpt_path", help="Lightning checkpoint (.ckpt)")
    p.add_argument("--weights", help="exported model (.safetensors from tools/export.py) instead of config + checkpoint")
    p.add_argument("--input", nargs="+", required=True, help="image files and/or folders")
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument("--score-threshold", type=float, default=0.5, help="detection score threshold")
    p.add_argument("--top-k", type=int, default=None, help="classes (classification, default 5) or max detections")
    p.add_argument("--annotations", help="COCO annotation file: image ids (by file name) and category ids for predictions.json")
    p.add_argument("--attention", action="store_true", help="also save DETR attention maps / ViT attention rollout")
    p.add_argument("--min-size", dest="min_size", type=int, help="detection: shorter side (default: the model's / data's)")
    p.add_argument("--max-size", dest="max_size", type=int, help="detection: longer side cap")
    p.add_argument("--seg-mode", dest="seg_mode", choices=("whole", "slide"), help="segmentation inference")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=None)
    p.add_argument("--num-workers", dest="num_workers", type=int, default=None,
                   help="processes decoding the images (default: up to 4 when there is more than one batch)")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    predictor = build_predictor(args)
    adapter = predictor.adapter
    if args.annotations and predictor.class_names is None:
        names = adapter.annotation_class_names(args.annotations)
        if names and predictor.num_classes in (None, len(names)):
            predictor.class_names = names
    # streamed: files decoded in DataLoader workers, each result written as it comes
    predict_to_folder(predictor, args.input, args.output, annotations=args.annotations,
                      score_threshold=args.score_threshold, top_k=args.top_k, attention=args.attention)
    return 0


# ---------------------------------------------------------------------------------------- export
def export_main(argv: Sequence[str] | None = None) -> int:
    """``tools/export.py``: safetensors + config (+ labels) and optionally ONNX checked with onnxruntime."""
    p = argparse.ArgumentParser(description="Export a visiontf checkpoint to safetensors and ONNX.")
    p.add_argument("--ckpt_path", required=True, help="Lightning checkpoint (.ckpt)")
    p.add_argument("--config", help="training YAML (class names, category ids, eval preprocessing)")
    p.add_argument("--output", required=True, help="model.safetensors")
    p.add_argument("--onnx", help="also write this ONNX file")
    p.add_argument("--image-size", dest="image_size", type=int, nargs=2, metavar=("H", "W"), help="ONNX example input size")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the onnxruntime comparison")
    p.add_argument("--atol", type=float, default=1e-4)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from visiontf.inference.export import export_model

    model, info = load_checkpoint_model(resolve_checkpoint(args.ckpt_path, config_checkpoint_dir(args.config)))
    dm, dm_args = datamodule_from_config(args.config) if args.config else (None, {})
    names = getattr(dm, "class_names", None) or info.get("class_names")
    l2c = getattr(dm, "label_to_cat_id", None) or info.get("label_to_cat_id")
    settings = canonical_cfg({**info.get("preprocess", {}), **legacy_eval_cfg(dm_args)})
    with torch.no_grad():
        report = export_model(model, args.output, names, l2c, settings,
                              onnx=args.onnx, image_size=args.image_size, check=args.check, atol=args.atol)
    print(json.dumps(report, indent=2))
    return 0



__all__ = ["build_predictor", "coco_results", "datamodule_from_config", "export_main", "predict_main"]
