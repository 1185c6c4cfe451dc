"""DDQ DETR's distinct query selection between decoder layers.

Zhang et al., "Dense Distinct Queries for End-to-End Object Detection" (CVPR 2023); mmdetection's
``DDQTransformerDecoder.select_distinct_queries`` and ``DDQDETRHead``. After every decoder layer but
the last, a class-agnostic NMS over the matching queries' current boxes, ranked by that layer's best
class probability, keeps the distinct ones. From the next layer on a suppressed query is hidden from
every query's self-attention, and its predictions leave the model: its logits are set to
:data:`SUPPRESSED_LOGIT`, so the one-to-one matching does not pick it, the class loss neither raises
nor lowers it, and it is never reported. One query per object is left to learn, and the loss trains
the model that runs at inference. The selection is cumulative (a suppressed query stays suppressed)
and runs within each Group DETR group. The first stage's selection is
:func:`~visiontf.models.deformable_detr.queries.distinct_first`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torchvision.ops import batched_nms, box_convert

from visiontf.nn.attention import restrict_attn_mask

__all__ = ["DistinctQueriesBetweenLayers", "SUPPRESSED_LOGIT"]

#: the logit of a suppressed query's every class: sigmoid ~4e-44, a finite matching cost (no inf for
#: the Hungarian solver) and no gradient
SUPPRESSED_LOGIT = -100.0


class DistinctQueriesBetweenLayers:
    """The decoder's ``after_layer`` step of DDQ DETR for one forward pass; ``keeps`` records each selection.

    Args:
        score: ``score(i, hidden)`` -> (B, N) best class probability of layer i's outputs (B, N, C): its
            hidden states, or its class logits themselves (RT-DETR's and D-FINE's decoders).
        iou: the NMS threshold (DDQ DETR 0.8, its first stage's too).
        num_denoising: P, the denoising queries in front of the matching ones (never selected).
        num_groups: G Group DETR groups of matching queries, each selected on its own.
        folded: the groups are folded into the self-attention's batch (no denoising queries), so
            the masks are per (image, group); else one mask spans all P + N queries of an image.
    """

    def __init__(self, score: Callable[[int, Tensor], Tensor], iou: float, num_denoising: int = 0, num_groups: int = 1,
                 folded: bool = False) -> None:
        self.score, self.iou, self.P, self.G, self.folded = score, iou, num_denoising, num_groups, folded
        #: (B, N) bool, True = kept, after each layer's selection (cumulative)
        self.keeps: list[Tensor] = []

    def __call__(self, i: int, hidden: Tensor, boxes: Tensor, mask: Tensor | None) -> Tensor:
        B, total, _ = hidden.shape
        P, G = self.P, self.G
        N = total - P
        with torch.no_grad():
            scores = self.score(i, hidden[:, P:]).float().reshape(-1)
            before = self.keeps[-1] if self.keeps else torch.ones(B, N, dtype=torch.bool, device=hidden.device)
            # the queries suppressed before rank last: they can suppress nothing that is kept
            scores = scores.masked_fill(~before.reshape(-1), -1e9)
            xyxy = box_convert(boxes[:, P:].reshape(-1, 4).float(), "cxcywh", "xyxy")
            group = torch.arange(B * G, device=hidden.device).repeat_interleave(N // G)
            kept = batched_nms(xyxy, scores, group, self.iou)
            # scatter of ones, not index_fill: the tracer of the ONNX export has no index_fill with a bool value
            flags = scores.new_zeros(B * N).scatter(0, kept, scores.new_ones(kept.shape))
            keep = (flags > 0).reshape(B, N) & before
        self.keeps.append(keep)
        if self.folded:
            allowed = keep.reshape(B * G, 1, 1, N // G)
        else:
            allowed = torch.cat([keep.new_ones(B, P), keep], 1).reshape(B, 1, 1, total)
        return restrict_attn_mask(mask, allowed)

    def mask_logits(self, logits: Tensor) -> Tensor:
        """(L, B, P + N, K) logits of every layer: layer j > 0 with the queries suppressed after layer j - 1 set to :data:`SUPPRESSED_LOGIT`."""
        if len(logits) != len(self.keeps) + 1:  # one selection after every layer but the last
            raise ValueError(f"{len(logits)} layers' logits for {len(self.keeps)} selections: give every layer's")
        return torch.stack([logits[0], *(self.mask_layer(layer, j) for j, layer in enumerate(logits[1:], 1))])

    def mask_layer(self, logits: Tensor, j: int) -> Tensor:
        """(B, P + N, K) logits of layer j (> 0) with the queries suppressed up to layer j - 1 set to
        :data:`SUPPRESSED_LOGIT`: what an evaluation that returns layer j alone reports."""
        P = self.P
        matching = torch.where(self.keeps[j - 1][..., None], logits[:, P:], logits.new_tensor(SUPPRESSED_LOGIT))
        return torch.cat([logits[:, :P], matching], 1)
