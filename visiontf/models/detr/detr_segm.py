"""DETR with its mask head: panoptic and instance segmentation (facebookresearch/detr ``DETRsegm``).

The detector of :mod:`visiontf.models.detr.detr` returns its backbone's layer1..layer4; the heads of
:mod:`visiontf.models.detr.mask_head` add ``pred_masks`` (B, Q, H/4, W/4), one mask logit map per query
of the last decoder layer. The published panoptic checkpoints (``detr_resnet50_panoptic``, ...) and
HuggingFace ``DetrForSegmentation`` weights load through :mod:`visiontf.models.detr.convert`; a
detector's weights load too, leaving the mask head at its initialisation, which the original then
trains alone on the frozen detector (``freeze_detector=True``, its ``--frozen_weights``).
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from visiontf.models._registry import register_model, torch_hub_state_dict
from visiontf.models.contract import ModelCfg, PretrainedCfg
from visiontf.models.detr.build import DETR_SECTIONS, build_detr
from visiontf.models.detr.convert import convert_state_dict
from visiontf.models.detr.detr import DETR
from visiontf.models.detr.mask_head import MaskHeadSmallConv, MHAttentionMap
from visiontf.models.mask_options import MaskOptions
from visiontf.models.matched_masks import MASK_LOGITS_OF, MatchedMaskLogits, TrainMasks, check_train_masks

#: the prefixes of the mask head's tensors (everything else is the detector)
MASK_HEAD_PREFIXES = ("bbox_attention.", "mask_head.")


class DETRSegm(DETR):
    """DETR plus the mask head: ``forward`` adds ``pred_masks`` (B, Q, H/4, W/4) logits to DETR's outputs.

    Args:
        freeze_detector: train the mask head alone: every detector parameter is frozen (and its
            BatchNorm layers, if any are not frozen ones, keep their statistics), as the original's
            ``DETRsegm(detr, freeze_detr=True)``.
        mask_heads: attention heads of the query-to-memory attention maps (default: ``nheads``, the
            original's). The head's GroupNorm needs ``hidden_dim + mask_heads`` divisible by 8.
        train_masks: ``"matched"``: a training forward leaves ``mask_logits_of`` for the set loss, which runs
            the head on the matched queries alone (:mod:`visiontf.models.matched_masks`: the original's loss
            and gradients at a fraction of its cost); ``"all"``: ``pred_masks`` of every query, as the original.
        mask_threshold, panoptic_threshold, thing_classes, min_area: post-processing settings
            (:class:`~visiontf.models.mask_options.MaskOptions`); ``thing_classes`` None makes
            instance masks only, a list of class indices also panoptic segments.
        *args, **kwargs: :class:`~visiontf.models.detr.detr.DETR`'s parts and arguments (:func:`~visiontf.models.detr.detr.build_detr`
            makes them from flat keyword arguments).
    """

    #: layer1..layer4: the mask head's FPN reads layer3, layer2, layer1
    backbone_stages = (1, 2, 3, 4)

    def __init__(
        self,
        *args,
        freeze_detector: bool = False,
        mask_heads: int | None = None,
        train_masks: TrainMasks = "matched",
        mask_threshold: float = 0.5,
        panoptic_threshold: float = 0.85,
        thing_classes: Sequence[int] | None = None,
        min_area: int = 4,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.train_masks = check_train_masks(train_masks)
        self.freeze_detector = freeze_detector
        if freeze_detector:  # before the heads exist, as the original: only they train
            for p in self.parameters():
                p.requires_grad_(False)
        heads = self.transformer.decoder.layers[0].self_attn.num_heads if mask_heads is None else int(mask_heads)
        hidden = self.hidden_dim
        self.bbox_attention = MHAttentionMap(hidden, hidden, heads, dropout=0.0)
        # FPN over layer3, layer2, layer1: coarsest first
        self.mask_head = MaskHeadSmallConv(hidden + heads, self.backbone.channels[2::-1], hidden)
        self.mask_options = MaskOptions(mask_threshold, panoptic_threshold,
                                        None if thing_classes is None else tuple(thing_classes), min_area)

    def train(self, mode: bool = True) -> DETRSegm:
        super().train(mode)
        if self.freeze_detector and mode:
            # a frozen detector's running statistics stay too (FrozenBatchNorm2d has none to move)
            for name, m in self.named_modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm) and not name.startswith(MASK_HEAD_PREFIXES):
                    m.eval()
        return self

    def forward(self, images: Tensor, mask: Tensor | None = None, need_weights: bool = False) -> dict:
        """DETR's outputs (:meth:`DETR.forward <visiontf.models.detr.detr.DETR.forward>`) plus ``pred_masks``
        (B, Q, H/4, W/4): mask logits of each query of the last decoder layer, on the padded image's grid. A
        training forward with ``train_masks="matched"`` gives ``mask_logits_of`` instead
        (:mod:`visiontf.models.matched_masks`)."""
        parts = self.encode(images, mask, need_weights)
        out = self.box_outputs(parts, need_weights)
        inputs = self.mask_inputs(parts, mask is not None)
        if self.training and self.train_masks == "matched":
            out[MASK_LOGITS_OF] = MatchedMaskLogits(self.masks_from, inputs)
        else:
            out["pred_masks"] = self.masks_from(inputs)
        return out

    def mask_inputs(self, parts: dict, padded: bool = True) -> dict:
        """What the head reads, per image, from :meth:`encode`'s outputs: the last decoder layer's ``queries``
        (B, Q, C), the projected features ``src`` and the ``memory`` (B, C, h, w), the padding mask ``pad``,
        and the ``fpns`` (layer3, layer2, layer1)."""
        src = parts["src"]
        B, C, h, w = src.shape
        maps = parts["maps"]
        return {"queries": parts["hs"][-1], "src": src, "memory": parts["memory"].transpose(1, 2).reshape(B, C, h, w),
                "pad": parts["feat_mask"] if padded else None, "fpns": [maps[2], maps[1], maps[0]]}

    def masks_from(self, inputs: dict) -> Tensor:
        """(B, Q, H/4, W/4) mask logits of every query of :meth:`mask_inputs`."""
        # the queries over the encoder memory; padded positions get no attention
        bbox_mask = self.bbox_attention(inputs["queries"], inputs["memory"], mask=inputs["pad"])
        seg = self.mask_head(inputs["src"], bbox_mask, inputs["fpns"])
        return seg.view(bbox_mask.shape[0], bbox_mask.shape[1], seg.shape[-2], seg.shape[-1])


#: the original's panoptic checkpoints: 250 classes (COCO panoptic's ids reach 200), things are ids <= 90
_FB = "https://dl.fbaipublicfiles.com/detr/"
_PANOPTIC = dict(num_classes=250, thing_classes=tuple(range(91)), channels_last=True)
DEFAULT_CFGS: dict[str, ModelCfg] = {
    "detr_resnet50_panoptic": ModelCfg(DETR_SECTIONS.of(backbone="resnet50", **_PANOPTIC),
                                       PretrainedCfg(url=_FB + "detr-r50-panoptic-00ce5173.pth")),
    "detr_resnet50_dc5_panoptic": ModelCfg(DETR_SECTIONS.of(backbone="resnet50", dilation=True, **_PANOPTIC),
                                           PretrainedCfg(url=_FB + "detr-r50-dc5-panoptic-da08f1b1.pth")),
    "detr_resnet101_panoptic": ModelCfg(DETR_SECTIONS.of(backbone="resnet101", **_PANOPTIC),
                                        PretrainedCfg(url=_FB + "detr-r101-panoptic-40021d53.pth")),
    # detr_tiny's detector (its weights load) with 8 attention maps: GroupNorm needs 128 + heads divisible by 8
    "detr_tiny_masks": ModelCfg(DETR_SECTIONS.of(backbone="resnet18", hidden_dim=128, nheads=4, enc_layers=3, dec_layers=3,
                                     dim_feedforward=512, num_queries=50, mask_heads=8)),
}
_TAGS = ("detection", "detr")


#: the registry-wide test's settings: as DETR's, with 8 heads of 16 dims (the mask head's GroupNorm(8) takes
#: hidden_dim + heads, and hidden_dim halved four times: hidden_dim a multiple of 128)
_TINY = dict(arch=dict(hidden_dim=128, nheads=8, enc_layers=1, dec_layers=2, dim_feedforward=32, num_queries=5))
_TEST = dict(test_kwargs=_TINY, test_image_size=(64, 64))
_TEST_R101 = dict(test_kwargs=dict(_TINY, backbone="resnet50"), test_image_size=(64, 64))


def _create(name: str, **kwargs) -> DETRSegm:
    return DETR_SECTIONS.create(lambda **kw: build_detr(DETRSegm, **kw), DEFAULT_CFGS[name], **kwargs)


def _original(name: str):
    return torch_hub_state_dict(DEFAULT_CFGS[name].pretrained_cfg.url, name)


@register_model(fetch_pretrained=_original("detr_resnet50_panoptic"), filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def detr_resnet50_panoptic(**kwargs) -> DETRSegm:
    """DETR R50 with the mask head (COCO panoptic val5k: 38.8 box AP, 31.1 mask AP, 43.4 PQ)."""
    return _create("detr_resnet50_panoptic", **kwargs)


@register_model(fetch_pretrained=_original("detr_resnet50_dc5_panoptic"), filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def detr_resnet50_dc5_panoptic(**kwargs) -> DETRSegm:
    """DETR R50-DC5 with the mask head (40.2 box AP, 31.9 mask AP, 44.6 PQ)."""
    return _create("detr_resnet50_dc5_panoptic", **kwargs)


@register_model(fetch_pretrained=_original("detr_resnet101_panoptic"), filter_fn=convert_state_dict, tags=_TAGS, **_TEST_R101)
def detr_resnet101_panoptic(**kwargs) -> DETRSegm:
    """DETR R101 with the mask head (40.1 box AP, 33.0 mask AP, 45.1 PQ)."""
    return _create("detr_resnet101_panoptic", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def detr_tiny_masks(**kwargs) -> DETRSegm:
    """``detr_tiny`` with the mask head: instance (and, given ``thing_classes``, panoptic) masks on CPU."""
    return _create("detr_tiny_masks", **kwargs)

