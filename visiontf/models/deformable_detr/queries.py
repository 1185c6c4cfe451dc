"""The decoder's initial queries of :class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR`.

One step of the model's forward (after :meth:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR.encode`,
before the decoder): learned queries, the original two-stage's encoder proposals, DINO's mixed
query selection (anchors from the top proposals, learned content queries), each repeated for
Group DETR's groups, and DINO's denoising queries placed before them.

Which queries may attend to which (:func:`self_attn_mask`): the decoder's self-attention input is the
denoising queries (DINO's contrastive denoising, in groups of ``dn_group_size``) followed by the matching
queries (Group DETR: ``num_groups`` groups of equal size, the first the inference set). Without denoising
the decoder folds the matching groups into the batch instead, and needs no mask.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import batched_nms, box_convert

from visiontf.models._registry import ModelArgumentError
from visiontf.models.deformable_detr.deformable_transformer import MultiScaleMemory
from visiontf.models.deformable_detr.denoising import DenoisingQueries
from visiontf.nn.indexing import gather_rows
from visiontf.nn.ms_deform_tables import tracing_shapes
from visiontf.nn.precision import at_least_float32

__all__ = ["DeformableQueries", "distinct_first"]


#: with ``count``, :func:`distinct_first`'s NMS first runs over this many times ``count`` best proposals of each image
CANDIDATES_PER_QUERY = 4


def distinct_first(scores: torch.Tensor, boxes_unact: torch.Tensor, iou: float, count: int | None = None) -> torch.Tensor:
    """``scores`` (B, S) ranked so that the proposals a class-agnostic NMS at ``iou`` keeps come first.

    DDQ DETR's distinct query selection. The ranking is the score itself (float64), plus 1e4 for the
    kept proposals: every kept one comes before every suppressed one, and each keeps its exact order
    within its set (no sigmoid, which ties the highest scores at 1.0 in float32 and would let an
    exported graph order them otherwise), so a top-K over the result picks distinct anchors while
    there are enough. Positions at -inf (padding, borders) stay there. No gradient flows through it.

    ``count``: the caller keeps the first ``count`` of the ranking (a top-``count`` follows). In eager
    mode the NMS then runs over each image's :data:`CANDIDATES_PER_QUERY` * ``count`` best proposals
    only, which decides the same first ``count``: greedy NMS keeps or suppresses a proposal by those
    scored above it alone. An image that keeps fewer than ``count`` of them has the NMS run over all its
    proposals. The NMS over all costs O(S^2) (about 1,000 positions an image at 224 px, 8,400 at 640);
    below the first ``count`` the two rankings may differ. An exported graph runs it over all.
    """
    B, S = scores.shape
    valid = torch.isfinite(scores)
    scores = at_least_float32(scores)  # NMS takes boxes and scores of one type; float64 stays float64
    ranked = scores.masked_fill(~valid, -1e9)
    M = S if count is None or tracing_shapes() else min(S, CANDIDATES_PER_QUERY * count)
    if M < S:
        candidates = torch.topk(ranked, M, dim=1).indices
        kept = _kept(ranked.gather(1, candidates), gather_rows(boxes_unact, candidates), iou)
        if bool(((kept > 0) & valid.gather(1, candidates)).sum(1).ge(count).all()):
            flags = torch.zeros_like(ranked).scatter(1, candidates, kept)
            return scores.double() + 1e4 * flags.double()
    return scores.double() + 1e4 * _kept(ranked, boxes_unact, iou).double()


def _kept(scores: torch.Tensor, boxes_unact: torch.Tensor, iou: float) -> torch.Tensor:
    """(B, N) 1 where a class-agnostic NMS of each image's (B, N) ``scores`` and (B, N, 4) cxcywh logit boxes keeps, else 0."""
    B, N = scores.shape
    boxes = box_convert(boxes_unact.to(scores.dtype).sigmoid().reshape(-1, 4), "cxcywh", "xyxy")
    flat = scores.reshape(-1)
    keep = batched_nms(boxes, flat, torch.arange(B, device=scores.device).repeat_interleave(N), iou)
    return torch.zeros_like(flat).scatter(0, keep, torch.ones_like(flat[keep])).reshape(B, N)


class DeformableQueries:
    """The query steps of :class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR`, which mixes this in.

    They read the model's ``arch_options`` (``num_queries``, ``two_stage``, ``select_padded_proposals``), ``dino_options``, ``transformer``,
    ``class_embed`` and ``bbox_embed`` (the last of each: the proposal heads), and, as the options
    make them, ``query_embed`` (learned queries), ``tgt_embed`` (mixed query selection) and
    ``label_enc`` (denoising).
    """

    def initial_queries(self, enc: MultiScaleMemory, num_groups: int = 1) -> dict:
        """Decoder inputs: ``tgt``, ``query_pos`` (B, G*Q, C), ``reference`` (B, G*Q, 2 or 4).

        Two-stage adds ``enc_outputs``; mixed query selection adds ``interm_outputs`` and leaves
        ``query_pos`` None (the decoder computes it from the anchors). ``num_groups`` G > 1 is
        Group DETR's training (the first Q queries are the inference set).
        """
        B, _, C = enc.memory.shape
        n = self.arch_options.num_queries * num_groups
        if self.dino_options.mixed_query_selection:
            return self._mixed_queries(enc, num_groups)
        if not self.arch_options.two_stage:
            query_pos, tgt = self.query_embed.weight[:n].split(C, dim=1)
            query_pos = query_pos.unsqueeze(0).expand(B, -1, -1)
            return {"tgt": tgt.unsqueeze(0).expand(B, -1, -1), "query_pos": query_pos, "reference": self.transformer.reference_points(query_pos).sigmoid()}
        enc_logits, enc_boxes, _ = self._encoder_proposals(enc, "two-stage")
        top = torch.topk(enc_logits[..., 0], self.arch_options.num_queries, dim=1)[1]
        reference = gather_rows(enc_boxes, top).detach().sigmoid()
        query_pos, tgt = self.transformer.proposal_queries(reference)
        return {
            "tgt": tgt, "query_pos": query_pos, "reference": reference,
            "enc_outputs": {"pred_logits": enc_logits, "pred_boxes": enc_boxes.sigmoid()},
        }

    def _encoder_proposals(self, enc: MultiScaleMemory, selection: str) -> tuple:
        """The proposal heads on every encoder position: logits, unactivated boxes and the proposals."""
        S = enc.memory.shape[1]
        if S < self.arch_options.num_queries:
            raise ModelArgumentError(
                f"{selection} selects num_queries={self.arch_options.num_queries} proposals, but the {enc.spatial_shapes} "
                f"feature maps of these images have only {S} positions; use larger images or fewer queries"
            )
        features, proposals = self.transformer.proposals(enc.memory, enc.padding_mask, enc.layout, enc.valid_counts)
        return self.class_embed[-1](features), at_least_float32(self.bbox_embed[-1](features)) + proposals, proposals

    def _mixed_queries(self, enc: MultiScaleMemory, num_groups: int) -> dict:
        """DINO's mixed query selection: anchors from the top-Q proposals, learned content queries."""
        B = enc.memory.shape[0]
        enc_logits, enc_boxes, proposals = self._encoder_proposals(enc, "mixed query selection")
        # best class score per position; padded and border positions (inf proposals) are never chosen,
        # unless the model reproduces DINO's code, which ranks them too (their boxes then sigmoid to 1)
        scores = at_least_float32(enc_logits.detach()).amax(-1)
        if not self.arch_options.select_padded_proposals:
            scores = scores.masked_fill(torch.isinf(proposals).any(-1), float("-inf"))
        if self.dino_options.distinct_query_iou is not None:
            scores = distinct_first(scores, enc_boxes.detach(), self.dino_options.distinct_query_iou, self.arch_options.num_queries)
        top = torch.topk(scores, self.arch_options.num_queries, dim=1)[1]
        boxes = gather_rows(enc_boxes, top)
        logits = gather_rows(enc_logits, top)
        reference = boxes.detach().sigmoid()
        tgt = self.tgt_embed.weight[: self.arch_options.num_queries * num_groups].unsqueeze(0).expand(B, -1, -1)
        return {
            "tgt": tgt, "query_pos": None, "reference": reference.repeat(1, num_groups, 1),
            "interm_outputs": {"pred_logits": logits, "pred_boxes": boxes.sigmoid()},
        }

    def _with_denoising(self, queries: dict, dn: DenoisingQueries) -> dict:
        """Denoising queries (label embeddings at noised boxes) placed before the matching queries."""
        reference = dn.boxes_unact.sigmoid()
        tgt = self.label_enc(dn.labels).to(queries["tgt"].dtype)
        out = dict(queries)
        out["tgt"] = torch.cat([tgt, queries["tgt"]], 1)
        out["reference"] = torch.cat([reference.to(queries["reference"].dtype), queries["reference"]], 1)
        if queries["query_pos"] is not None:  # pure two-stage: positions from the boxes, as its proposals'
            out["query_pos"] = torch.cat([self.transformer.proposal_queries(reference)[0], queries["query_pos"]], 1)
        return out


def self_attn_mask(num_denoising_queries: int, dn_group_size: int, num_matching: int, num_groups: int, device=None) -> Tensor:
    """Bool (N, N) decoder self-attention mask, True = may attend, N = denoising + matching queries.

    Each denoising group sees itself and the matching queries; matching queries see only their
    own Group DETR group, never a denoising query (they would read the answer; DINO's mask).
    """
    P = num_denoising_queries
    dn_group = torch.arange(P, device=device) // max(dn_group_size, 1)
    # the denoising groups' count from the sizes, not from dn_group (reading a CUDA tensor waits for the GPU)
    dn_groups = (P - 1) // max(dn_group_size, 1) + 1 if P else 0
    match_group = torch.arange(num_matching, device=device) // (num_matching // num_groups) + dn_groups
    group = torch.cat([dn_group, match_group])
    allowed = group[:, None] == group[None, :]
    allowed[:P, P:] = True
    return allowed
