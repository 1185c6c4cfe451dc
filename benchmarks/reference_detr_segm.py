"""The ORIGINAL DETR mask head (facebookresearch/detr ``models/segmentation.py``), re-implemented as a reference.

The original repository cannot be imported in tests, so this module re-creates, step by step and in
the original's module tree, what CI compares visiontf against:

* :class:`OriginalDETRsegm`: :class:`~benchmarks.reference_detr.OriginalDETR` under ``detr.`` with
  its body returning layer1..layer4, plus ``bbox_attention`` and ``mask_head`` with the original's
  parameter names (the published panoptic checkpoints' key layout);
* :func:`reference_postprocess_segm` and :func:`reference_postprocess_panoptic`: ``PostProcessSegm``
  and ``PostProcessPanoptic``, including the PIL round trip of the segment ids and the small-segment
  loop;
* :func:`reference_loss_masks`: ``SetCriterion.loss_masks`` (focal and dice losses on the matched
  queries, masks padded to the batch's largest and the predictions upsampled to it);
* :func:`reference_masks_to_boxes`: ``util.box_ops.masks_to_boxes``.

``benchmarks/detr_segm_parity.py`` checks each against the fetched original on random weights and
inputs (its result is recorded in docs/segmentation.md); ``tests/test_detr_segm_*.py`` compare
visiontf with this module.
"""
from __future__ import annotations

import io
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from benchmarks.reference_detr import OriginalDETR

# --------------------------------------------------------------------------- model


class _AttentionMap(nn.Module):
    """``MHAttentionMap``: per-head softmax of query . key over a 2D map, the key a 1x1 convolution."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.hidden_dim = heads, d
        self.q_linear = nn.Linear(d, d)
        self.k_linear = nn.Linear(d, d)
        self.normalize_fact = float(d / heads) ** -0.5

    def forward(self, q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
        q = self.q_linear(q)
        k = F.conv2d(k, self.k_linear.weight.unsqueeze(-1).unsqueeze(-1), self.k_linear.bias)
        n, c = self.num_heads, self.hidden_dim // self.num_heads
        qh = q.view(q.shape[0], q.shape[1], n, c)
        kh = k.view(k.shape[0], n, c, k.shape[-2], k.shape[-1])
        w = torch.einsum("bqnc,bnchw->bqnhw", qh * self.normalize_fact, kh)
        if mask is not None:
            w.masked_fill_(mask.unsqueeze(1).unsqueeze(1), float("-inf"))
        return F.softmax(w.flatten(2), dim=-1).view(w.size())


def _per_query(t: Tensor, n: int) -> Tensor:
    return t.unsqueeze(1).repeat(1, int(n), 1, 1, 1).flatten(0, 1)


class _SmallConv(nn.Module):
    """``MaskHeadSmallConv``: conv-GN-ReLU twice, then three upsampling steps each adding an adapted FPN map."""

    def __init__(self, dim: int, fpn_dims: list[int], context: int) -> None:
        super().__init__()
        widths = [dim, context // 2, context // 4, context // 8, context // 16]
        self.lay1, self.gn1 = nn.Conv2d(dim, dim, 3, padding=1), nn.GroupNorm(8, dim)
        for i in range(2, 6):
            setattr(self, f"lay{i}", nn.Conv2d(widths[i - 2], widths[i - 1], 3, padding=1))
            setattr(self, f"gn{i}", nn.GroupNorm(8, widths[i - 1]))
        self.out_lay = nn.Conv2d(widths[4], 1, 3, padding=1)
        for i in range(3):
            setattr(self, f"adapter{i + 1}", nn.Conv2d(fpn_dims[i], widths[i + 1], 1))

    def forward(self, x: Tensor, bbox_mask: Tensor, fpns: list[Tensor]) -> Tensor:
        x = torch.cat([_per_query(x, bbox_mask.shape[1]), bbox_mask.flatten(0, 1)], 1)
        x = F.relu(self.gn1(self.lay1(x)))
        x = F.relu(self.gn2(self.lay2(x)))
        for i, fpn in enumerate(fpns):
            cur = getattr(self, f"adapter{i + 1}")(fpn)
            if cur.size(0) != x.size(0):
                cur = _per_query(cur, x.size(0) // cur.size(0))
            x = cur + F.interpolate(x, size=cur.shape[-2:], mode="nearest")
            x = F.relu(getattr(self, f"gn{i + 3}")(getattr(self, f"lay{i + 3}")(x)))
        return self.out_lay(x)


class OriginalDETRsegm(nn.Module):
    """``DETRsegm(detr)``: ``state_dict()`` has ``detr.*``, ``bbox_attention.*`` and ``mask_head.*`` as
    the published panoptic checkpoints. :meth:`forward` returns the original's output dict (aux on)."""

    def __init__(self, fpn_dims: list[int] | None = None, **detr_kwargs) -> None:
        super().__init__()
        self.detr = OriginalDETR(**detr_kwargs)
        self.detr.backbone[0].body.return_layers = {f"layer{i}": str(i - 1) for i in range(1, 5)}
        d = self.detr.query_embed.weight.shape[1]
        heads = detr_kwargs.get("h", 8)
        self.bbox_attention = _AttentionMap(d, heads)
        big = detr_kwargs.get("backbone", "resnet50") not in ("resnet18", "resnet34")
        self.mask_head = _SmallConv(d + heads, fpn_dims or ([1024, 512, 256] if big else [256, 128, 64]), d)

    def forward(self, images: Tensor, mask: Tensor) -> dict:
        t = self.detr.transform(images, mask)
        hs = t["hs"]
        logits = self.detr.class_embed(hs)
        x = hs
        for i, lin in enumerate(self.detr.bbox_embed.layers):
            x = lin(x) if i == 2 else F.relu(lin(x))
        boxes = x.sigmoid()
        out = {"pred_logits": logits[-1], "pred_boxes": boxes[-1],
               "aux_outputs": [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]}
        bbox_mask = self.bbox_attention(hs[-1], t["memory"], t["mask"])
        f = t["features"]
        seg = self.mask_head(t["src_proj"], bbox_mask, [f[2], f[1], f[0]])
        out["pred_masks"] = seg.view(images.shape[0], hs.shape[2], seg.shape[-2], seg.shape[-1])
        return out


# --------------------------------------------------------------------------- post-processing


def reference_postprocess_segm(results: list[dict], outputs: dict, orig_sizes: Tensor, max_sizes: Tensor,
                               threshold: float = 0.5) -> list[dict]:
    """``PostProcessSegm``: masks upsampled to the batch's largest processed size, thresholded, cropped to
    each image's processed size, then nearest-resized to its original size; ``masks`` (Q, 1, H, W) uint8."""
    max_h, max_w = max_sizes.max(0)[0].tolist()
    m = F.interpolate(outputs["pred_masks"].squeeze(2), size=(max_h, max_w), mode="bilinear", align_corners=False)
    m = (m.sigmoid() > threshold).cpu()
    for i, (cur, t, tt) in enumerate(zip(m, max_sizes, orig_sizes)):
        crop = cur[:, : t[0], : t[1]].unsqueeze(1)
        results[i]["masks"] = F.interpolate(crop.float(), size=tuple(tt.tolist()), mode="nearest").byte()
    return results


def id2rgb(ids: np.ndarray) -> np.ndarray:
    """panopticapi's ``id2rgb``: id = R + 256 G + 256^2 B."""
    rgb = np.zeros(tuple(ids.shape) + (3,), dtype=np.uint8)
    rest = ids.copy()
    for c in range(3):
        rgb[..., c] = rest % 256
        rest //= 256
    return rgb


def rgb2id(rgb: np.ndarray) -> np.ndarray:
    """panopticapi's ``rgb2id``."""
    rgb = rgb.astype(np.int32)
    return rgb[..., 0] + 256 * rgb[..., 1] + 256 * 256 * rgb[..., 2]


def _ids_and_area(masks: Tensor, n: int, hw: tuple[int, int], target: tuple[int, int], stuff: dict | None):
    """The segment id of each pixel (softmax over the masks, argmax), stuff duplicates merged when ``stuff``
    is given, through PNG colours and a nearest resize to ``target``; with each id's pixel count."""
    h, w = hw
    prob = masks.transpose(0, 1).softmax(-1)
    ids = torch.zeros((h, w), dtype=torch.long) if prob.shape[-1] == 0 else prob.argmax(-1).view(h, w)
    for same in (stuff or {}).values():
        if len(same) > 1:
            for k in same:
                ids.masked_fill_(ids.eq(k), same[0])
    img = Image.fromarray(id2rgb(ids.view(h, w).cpu().numpy())).resize((target[1], target[0]), Image.NEAREST)
    ids = torch.from_numpy(rgb2id(np.asarray(img)))
    return [ids.eq(i).sum().item() for i in range(n)], img


def reference_postprocess_panoptic(outputs: dict, processed_sizes, target_sizes=None, is_thing_map=None,
                                   threshold: float = 0.85) -> list[dict]:
    """``PostProcessPanoptic``: ``{"png_string", "segments_info"}`` per image."""
    target_sizes = processed_sizes if target_sizes is None else target_sizes
    preds = []
    num_logits = outputs["pred_logits"].shape[-1]
    for logits, masks, size, target in zip(outputs["pred_logits"], outputs["pred_masks"], processed_sizes, target_sizes):
        size, target = tuple(int(v) for v in size), tuple(int(v) for v in target)
        scores, labels = logits.softmax(-1).max(-1)
        keep = labels.ne(num_logits - 1) & (scores > threshold)
        scores, classes, masks = scores[keep], labels[keep], masks[keep]
        masks = F.interpolate(masks[:, None], size, mode="bilinear").squeeze(1)
        h, w = masks.shape[-2:]
        masks = masks.flatten(1)
        stuff = defaultdict(list)
        for k, label in enumerate(classes):
            if not is_thing_map[label.item()]:
                stuff[label.item()].append(k)

        area, img = _ids_and_area(masks, len(scores), (h, w), target, stuff)
        if classes.numel() > 0:
            while True:
                small = torch.as_tensor([area[i] <= 4 for i in range(len(classes))], dtype=torch.bool)
                if not small.any().item():
                    break
                scores, classes, masks = scores[~small], classes[~small], masks[~small]
                area, img = _ids_and_area(masks, len(scores), (h, w), target, None)
        segments = [{"id": i, "isthing": is_thing_map[classes[i].item()], "category_id": classes[i].item(), "area": a}
                    for i, a in enumerate(area)]
        with io.BytesIO() as buf:
            img.save(buf, format="PNG")
            preds.append({"png_string": buf.getvalue(), "segments_info": segments})
    return preds


# --------------------------------------------------------------------------- loss


def _focal(inputs: Tensor, targets: Tensor, num_boxes: float, alpha: float = 0.25, gamma: float = 2) -> Tensor:
    prob = inputs.sigmoid()
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = prob * targets + (1 - prob) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return loss.mean(1).sum() / num_boxes


def _dice(inputs: Tensor, targets: Tensor, num_boxes: float) -> Tensor:
    inputs = inputs.sigmoid().flatten(1)
    numerator = 2 * (inputs * targets).sum(1)
    denominator = inputs.sum(-1) + targets.sum(-1)
    return (1 - (numerator + 1) / (denominator + 1)).sum() / num_boxes


def reference_loss_masks(outputs: dict, targets: list[dict], indices, num_boxes: float) -> dict[str, Tensor]:
    """``SetCriterion.loss_masks``: every target's masks zero-padded to the largest (N, H, W) of the batch."""
    batch = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
    src = torch.cat([s for s, _ in indices])
    tgt_batch = torch.cat([torch.full_like(t, i) for i, (_, t) in enumerate(indices)])
    tgt = torch.cat([t for _, t in indices])
    pred = outputs["pred_masks"][batch, src]
    shapes = [list(t["masks"].shape) for t in targets]
    n, H, W = (max(s[i] for s in shapes) for i in range(3))
    padded = torch.zeros((len(targets), n, H, W), dtype=targets[0]["masks"].dtype)
    for t, p in zip(targets, padded):
        m = t["masks"]
        p[: m.shape[0], : m.shape[1], : m.shape[2]].copy_(m)
    target = padded.to(pred)[tgt_batch, tgt]
    pred = F.interpolate(pred[:, None], size=target.shape[-2:], mode="bilinear", align_corners=False)[:, 0].flatten(1)
    target = target.flatten(1).view(pred.shape)
    return {"loss_mask": _focal(pred, target, num_boxes), "loss_dice": _dice(pred, target, num_boxes)}


def reference_masks_to_boxes(masks: Tensor) -> Tensor:
    """``util.box_ops.masks_to_boxes``: xyxy of each (N, H, W) mask, the max corner inclusive."""
    if masks.numel() == 0:
        return torch.zeros((0, 4), device=masks.device)
    h, w = masks.shape[-2:]
    y, x = torch.meshgrid(torch.arange(0, h, dtype=torch.float), torch.arange(0, w, dtype=torch.float), indexing="ij")
    xm = masks * x.unsqueeze(0)
    ym = masks * y.unsqueeze(0)
    not_m = ~(masks.bool())
    return torch.stack([xm.masked_fill(not_m, 1e8).flatten(1).min(-1)[0], ym.masked_fill(not_m, 1e8).flatten(1).min(-1)[0],
                        xm.flatten(1).max(-1)[0], ym.flatten(1).max(-1)[0]], 1)
