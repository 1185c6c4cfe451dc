"""The DINO line's training options of :class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR`, as one object.

Each is off by default, so that the published Deformable DETR models stay exact. The model takes
them as flat keyword arguments (what configs' ``model_kwargs``, checkpoints' hyper-parameters and
:mod:`visiontf.models.deformable_detr.dino`'s variants pass) and keeps them together as ``model.dino_options``.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DinoOptions"]


@dataclass(frozen=True)
class DinoOptions:
    """Training options of the DINO line (all off by default, as in the published Deformable DETR).

    Args:
        mixed_query_selection: DINO (Zhang et al., 2023, sec. 3.3; ``two_stage_type='standard'``
            with ``embed_init_tgt``): the top ``num_queries`` encoder proposals (by their best
            class score) give the anchor boxes, the content queries are learned
            (``tgt_embed``), and each decoder layer's positional queries are computed from its
            current anchor box (``ref_point_head``, DAB-DETR's dynamic anchors). Needs
            ``two_stage``. The selected proposals are returned as ``interm_outputs`` and
            supervised with the class labels (DINO's ``interm`` loss), unlike the original
            two-stage's class-agnostic ``enc_outputs`` over every position.
        look_forward_twice: DINO sec. 3.4: layer i's boxes are refined from layer i-1's boxes
            before they are detached, so layer i's box loss also trains layer i-1 (the
            reference the next layer attends with stays detached). Needs ``with_box_refine``.
        num_denoising: DINO's contrastive denoising (``dn_number``, sec. 3.2; DN-DETR): this many
            positive slots of noised ground-truth queries per batch (plus as many negatives), fed
            before the matching queries in training only; 0 disables it. Needs 4-d anchors
            (``two_stage``). See :mod:`visiontf.models.deformable_detr.denoising`.
        dn_label_noise_ratio, dn_box_noise_scale: DINO's 0.5 and 0.4 (its ``DINO_4scale.py``).
        num_query_groups: Group DETR (Chen et al., 2023): in training, G groups of
            ``num_queries`` queries, each matched one-to-one to the targets on its own and
            attending only to itself (the groups are folded into the batch for self-attention,
            or masked: :func:`visiontf.models.deformable_detr.queries.self_attn_mask`); inference uses the first group only.
            Learned queries get G sets of embeddings; with mixed query selection every group
            starts from the same selected anchors and has its own content queries. RF-DETR trains
            with 13 groups.
        share_decoder_heads: one class head and one box head for all decoder layers (DINO's
            ``dec_pred_class_embed_share`` / ``dec_pred_bbox_embed_share``); the two-stage
            proposal heads stay separate.
        distinct_query_iou: DDQ DETR (Zhang et al., CVPR 2023, "Dense Distinct Queries"): mixed
            query selection takes the top ``num_queries`` proposals among those that a
            class-agnostic NMS at this IoU keeps (the suppressed ones only fill what is left), so
            no two anchors start on one object and the one-to-one matching is not asked to tell
            near-identical queries apart. Part of the model in training and inference (not a
            post-processing); None (DINO) selects by score alone. Needs ``mixed_query_selection``.
        distinct_between_layers: DDQ DETR's distinct query selection also after every decoder
            layer but the last, at ``distinct_query_iou``: the queries a class-agnostic NMS of that
            layer's boxes suppresses are hidden from the next layers' self-attention and leave the
            predictions (neither matched nor trained by the class loss, never reported):
            :class:`~visiontf.models.deformable_detr.distinct_queries.DistinctQueriesBetweenLayers`. Part of the
            model in training and inference. Needs ``distinct_query_iou`` and ``with_box_refine``.
        position_relation: Relation-DETR (Hou et al., ECCV 2024): every decoder layer after the
            first adds a learned, non-negative per-head bias to its query self-attention logits,
            computed from the geometry of each pair of queries' boxes (the previous layer's input
            and output boxes: :class:`~visiontf.nn.position_relation.PositionRelationEmbedding`),
            so that queries on one object see each other and learn to keep one. Adds
            ``transformer.decoder.position_relation.proj`` (64 x heads weights). Needs
            ``two_stage`` (4-d boxes in every layer).
    """

    mixed_query_selection: bool = False
    look_forward_twice: bool = False
    num_denoising: int = 0
    dn_label_noise_ratio: float = 0.5
    dn_box_noise_scale: float = 0.4
    num_query_groups: int = 1
    share_decoder_heads: bool = False
    distinct_query_iou: float | None = None
    position_relation: bool = False
    distinct_between_layers: bool = False

    def check(self, num_queries: int, with_box_refine: bool, two_stage: bool) -> None:
        """Refuse combinations (with the model's architecture) that cannot work, naming the fix."""
        # checked at construction, not only at the first denoising step of a run
        if not 0.0 <= self.dn_label_noise_ratio <= 1.0:
            raise ValueError(f"dn_label_noise_ratio must be in [0, 1] (DINO 0.5), got {self.dn_label_noise_ratio}")
        if self.dn_box_noise_scale < 0:
            raise ValueError(f"dn_box_noise_scale must be >= 0 (DINO 0.4), got {self.dn_box_noise_scale}")
        if self.mixed_query_selection and not two_stage:
            raise ValueError("mixed_query_selection=True selects encoder proposals: it needs two_stage=True (and with_box_refine=True)")
        if self.distinct_query_iou is not None:
            if not self.mixed_query_selection:
                raise ValueError("distinct_query_iou selects distinct encoder proposals: it needs mixed_query_selection=True")
            if not 0.0 < self.distinct_query_iou <= 1.0:
                raise ValueError(f"distinct_query_iou must be in (0, 1] (DDQ DETR 0.8) or None, got {self.distinct_query_iou}")
        if self.distinct_between_layers and (self.distinct_query_iou is None or not with_box_refine):
            raise ValueError(
                "distinct_between_layers=True selects distinct queries at distinct_query_iou after each decoder layer: "
                "it needs distinct_query_iou (DDQ DETR 0.8) and with_box_refine=True"
            )
        if self.position_relation and not two_stage:
            raise ValueError("position_relation=True relates the 4-d boxes of the decoder's queries: it needs two_stage=True (and with_box_refine=True)")
        if self.look_forward_twice and not with_box_refine:
            raise ValueError("look_forward_twice=True refines each layer's boxes from the previous layer's: it needs with_box_refine=True")
        if self.share_decoder_heads and not with_box_refine:
            raise ValueError("share_decoder_heads=True only matters with with_box_refine=True (without it one head is always shared)")
        if self.num_denoising < 0:
            raise ValueError(f"num_denoising must be >= 0 (0 disables denoising), got {self.num_denoising}")
        if self.num_denoising and not two_stage:
            raise ValueError(
                "num_denoising > 0 feeds noised ground-truth boxes as 4-d anchors: it needs two_stage=True "
                "(best with mixed_query_selection=True, as DINO)"
            )
        groups = self.num_query_groups
        if groups < 1:
            raise ValueError(f"num_query_groups must be >= 1 (1: no Group DETR), got {groups}")
        if groups > num_queries:
            raise ValueError(
                f"num_query_groups={groups} is larger than num_queries={num_queries}: each Group DETR group is a "
                f"full set of num_queries queries (RF-DETR: 13 groups of 300), so this trains {groups * num_queries} "
                "queries per image; did you swap the two? Use num_query_groups <= num_queries"
            )
        if groups > 1 and two_stage and not self.mixed_query_selection:
            raise ValueError(
                "num_query_groups > 1 with pure two-stage queries would give every group the same queries; "
                "use mixed_query_selection=True (groups get their own content queries) or learned queries (two_stage=False)"
            )
