"""Where a trained DINO-line detector's duplicates come from (the figures of docs/record/detection.md, "Duplicates").

For a checkpoint and its COCO-layout validation split, without NMS:

* per decoder layer: COCO mAP and ``dup_rate`` (confident same-class pairs with IoU > 0.7 per
  confident detection, :func:`visiontf.evaluation.duplicates.duplicate_stats`), to see whether the
  decoder removes duplicates layer by layer;
* the final layer with NMS (0.7, within each label) applied only among detections scoring above a
  threshold: which scores NMS's gain comes from;
* the IoU of the initial anchors (the selected proposals, ``interm_outputs``) of each confident
  duplicate pair: whether the pairs started on one object.

    python scripts/experiments/detection_duplicates.py --ckpt runs/s53/checkpoints/last.ckpt --root data/shapes_s53
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections import defaultdict
from pathlib import Path

import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torchvision.ops import batched_nms, box_convert, box_iou

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import setup_torch  # noqa: E402
from visiontf.evaluation.duplicates import duplicate_stats  # noqa: E402
from visiontf.set_prediction.postprocess import DeformablePostProcess  # noqa: E402
from visiontf.tasks.checkpoints import load_checkpoint_model  # noqa: E402
from visiontf.tasks.detection.coco_data import CocoDataModule  # noqa: E402


def coco_map(gt: COCO, results: list[dict]) -> float:
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(results), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[0])


def nms_above(results: list[dict], score: float, iou: float = 0.7) -> list[dict]:
    """NMS within each label among the detections scoring above ``score``; the others kept as they are."""
    by_image = defaultdict(list)
    for r in results:
        by_image[r["image_id"]].append(r)
    out = []
    for rs in by_image.values():
        high = [r for r in rs if r["score"] > score]
        if high:
            boxes = box_convert(torch.tensor([r["bbox"] for r in high]), "xywh", "xyxy")
            keep = batched_nms(boxes, torch.tensor([r["score"] for r in high]), torch.tensor([r["category_id"] for r in high]), iou)
            high = [high[i] for i in keep.tolist()]
        out += high + [r for r in rs if r["score"] <= score]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--root", required=True, help="the COCO-layout dataset root of the checkpoint's data")
    parser.add_argument("--val_size", type=int, default=224)
    parser.add_argument("--max_size", type=int, default=333)
    args = parser.parse_args()
    setup_torch()

    model, _ = load_checkpoint_model(args.ckpt)
    model.eval()
    dm = CocoDataModule(args.root, batch_size=4, num_workers=0, val_size=args.val_size, max_size=args.max_size)
    dm.setup("validate")
    postprocess = DeformablePostProcess(num_top=100)
    layers: list[list[dict]] = []
    anchor_iou_bins = [0] * 10
    with torch.no_grad():
        for images, mask, targets in dm.val_dataloader():
            out = model(images, mask)
            outs = [*out.get("aux_outputs", []), {"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}]
            layers = layers or [[] for _ in outs]
            sizes = torch.stack([t["orig_size"] for t in targets])
            for results, layer_out in zip(layers, outs):
                for det, t in zip(postprocess(layer_out, sizes), targets):
                    for s, label, b in zip(det["scores"].tolist(), det["labels"].tolist(), det["boxes"].tolist()):
                        results.append({"image_id": int(t["image_id"]), "category_id": dm.label_to_cat_id[label], "score": s,
                                        "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]]})
            if "interm_outputs" not in out:
                continue
            scores, labels = out["pred_logits"].sigmoid().max(-1)
            for i in range(len(targets)):
                confident = (scores[i] > 0.3).nonzero().flatten()
                final = box_convert(out["pred_boxes"][i, confident], "cxcywh", "xyxy")
                anchors = box_convert(out["interm_outputs"]["pred_boxes"][i, confident], "cxcywh", "xyxy")
                same = labels[i, confident][:, None] == labels[i, confident][None, :]
                a, b = torch.triu((box_iou(final, final) > 0.7) & same, 1).nonzero(as_tuple=True)
                for iou in box_iou(anchors, anchors)[a, b].tolist():
                    anchor_iou_bins[min(int(iou * 10), 9)] += 1

    gt = COCO(str(dm.val_ann_file))
    for i, results in enumerate(layers):
        dup = duplicate_stats(results)
        print(f"decoder layer {i + 1}: mAP {coco_map(gt, results):.4f}, dup_rate {dup['dup_rate']:.3f} "
              f"({dup['dup_pairs']:.0f} pairs / {dup['confident']:.0f} confident)")
    for score in (0.0, 0.1, 0.3, 0.5, 1.0):
        print(f"final layer, NMS 0.7 within each label among scores > {score}: mAP {coco_map(gt, nms_above(layers[-1], score)):.4f}")
    print("anchor IoU of the confident duplicate pairs, in tenths 0-0.1 ... 0.9-1:", anchor_iou_bins)


if __name__ == "__main__":
    main()
