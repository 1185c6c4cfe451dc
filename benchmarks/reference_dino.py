"""REFERENCE COPY of IDEA-Research/DINO's inference code (not visiontf's code): the baseline of parity tests.

Source: https://github.com/IDEA-Research/DINO at commit faa8520fe9604c23ad65a48bc583550a44c0e3ab
(2023-12-20), Apache License 2.0, Copyright (c) 2022 IDEA (parts: Copyright (c) 2021 Microsoft,
Copyright (c) Facebook, Inc. and its affiliates, Copyright (c) 2020 SenseTime), files:
``models/dino/dino.py`` (DINO, PostProcess, build_dino), ``models/dino/deformable_transformer.py``,
``models/dino/backbone.py``, ``models/dino/position_encoding.py``, ``models/dino/utils.py``,
``models/dino/dn_components.py`` (the inference branch of ``prepare_for_cdn``),
``models/dino/ops/modules/ms_deform_attn.py``, ``models/dino/ops/functions/ms_deform_attn_func.py``,
``util/misc.py`` (inverse_sigmoid, NestedTensor), ``util/box_ops.py``, and the settings of
``config/DINO/DINO_4scale.py`` / ``DINO_5scale.py`` (:func:`dino_args`).

Classes, functions, parameter names and the order of operations are the original's, so that
``state_dict()`` has the published checkpoints' key layout (``checkpoint0011_4scale.pth``, ...) and
the forward gives the original's numbers. Changes, all for a CPU-only, offline inference baseline:

* ``MSDeformAttn`` calls ``ms_deform_attn_core_pytorch`` (the repository's own pure-PyTorch core)
  instead of the compiled CUDA ``MultiScaleDeformableAttention`` op (its CPU op raises "Not
  implement on cpu");
* no ``.cuda()`` / ``.to('cuda')``; the backbone is built without ImageNet weights (the original
  downloads them when ``is_main_process()``);
* split over three files (this one, ``reference_dino_transformer.py``, ``reference_dino_layers.py``)
  and trimmed to what inference of the R50 DINO-4scale/5scale configs runs: the training branch of
  ``prepare_for_cdn``, ``dn_post_process``, the criterion, matcher, segmentation, Swin/ConvNeXt
  backbones, the unused two-stage types (``two_stage_type`` 'standard' only, no pattern
  embeddings, no added queries), encoder/decoder layer dropout, the decoder query perturber,
  ``dec_layer_number`` and the ``ca_label``/``ca_content`` decoder self-attentions are left out;
  the asserts that guarded them are kept where they still apply;
* :func:`dino_args` replaces the SLConfig file parsing with the configs' values as a namespace.
"""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace
from typing import List

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from benchmarks.reference_dino_layers import MLP, NestedTensor, box_cxcywh_to_xyxy, build_backbone, inverse_sigmoid
from benchmarks.reference_dino_transformer import build_deformable_transformer


# =========================================================================== models/dino/dn_components.py (inference)
def prepare_for_cdn(dn_args, training, num_queries, num_classes, hidden_dim, label_enc):
    if training:
        raise NotImplementedError("trimmed: the reference copy runs inference only (the training branch uses .cuda())")
    input_query_label = None
    input_query_bbox = None
    attn_mask = None
    dn_meta = None
    return input_query_label, input_query_bbox, attn_mask, dn_meta


# =========================================================================== models/dino/dino.py
class DINO(nn.Module):
    """ This is the Cross-Attention Detector module that performs object detection """
    def __init__(self, backbone, transformer, num_classes, num_queries,
                    aux_loss=False, iter_update=False,
                    query_dim=2,
                    num_feature_levels=1,
                    nheads=8,
                    two_stage_type='no',
                    dec_pred_class_embed_share=True,
                    dec_pred_bbox_embed_share=True,
                    two_stage_class_embed_share=True,
                    two_stage_bbox_embed_share=True,
                    decoder_sa_type = 'sa',
                    num_patterns = 0,
                    dn_number = 100,
                    dn_box_noise_scale = 0.4,
                    dn_label_noise_ratio = 0.5,
                    dn_labelbook_size = 100,
                    ):
        super().__init__()
        self.num_queries = num_queries
        self.transformer = transformer
        self.num_classes = num_classes
        self.hidden_dim = hidden_dim = transformer.d_model
        self.num_feature_levels = num_feature_levels
        self.nheads = nheads
        self.label_enc = nn.Embedding(dn_labelbook_size + 1, hidden_dim)

        # setting query dim
        self.query_dim = query_dim
        assert query_dim == 4

        # for dn training
        self.num_patterns = num_patterns
        self.dn_number = dn_number
        self.dn_box_noise_scale = dn_box_noise_scale
        self.dn_label_noise_ratio = dn_label_noise_ratio
        self.dn_labelbook_size = dn_labelbook_size

        # prepare input projection layers
        assert num_feature_levels > 1
        num_backbone_outs = len(backbone.num_channels)
        input_proj_list = []
        for _ in range(num_backbone_outs):
            in_channels = backbone.num_channels[_]
            input_proj_list.append(nn.Sequential(
                nn.Conv2d(in_channels, hidden_dim, kernel_size=1),
                nn.GroupNorm(32, hidden_dim),
            ))
        for _ in range(num_feature_levels - num_backbone_outs):
            input_proj_list.append(nn.Sequential(
                nn.Conv2d(in_channels, hidden_dim, kernel_size=3, stride=2, padding=1),
                nn.GroupNorm(32, hidden_dim),
            ))
            in_channels = hidden_dim
        self.input_proj = nn.ModuleList(input_proj_list)

        self.backbone = backbone
        self.aux_loss = aux_loss
        self.box_pred_damping = box_pred_damping = None

        self.iter_update = iter_update
        assert iter_update, "Why not iter_update?"

        # prepare pred layers
        self.dec_pred_class_embed_share = dec_pred_class_embed_share
        self.dec_pred_bbox_embed_share = dec_pred_bbox_embed_share
        # prepare class & box embed
        _class_embed = nn.Linear(hidden_dim, num_classes)
        _bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        # init the two embed layers
        prior_prob = 0.01
        bias_value = -math.log((1 - prior_prob) / prior_prob)
        _class_embed.bias.data = torch.ones(self.num_classes) * bias_value
        nn.init.constant_(_bbox_embed.layers[-1].weight.data, 0)
        nn.init.constant_(_bbox_embed.layers[-1].bias.data, 0)

        if dec_pred_bbox_embed_share:
            box_embed_layerlist = [_bbox_embed for i in range(transformer.num_decoder_layers)]
        else:
            box_embed_layerlist = [copy.deepcopy(_bbox_embed) for i in range(transformer.num_decoder_layers)]
        if dec_pred_class_embed_share:
            class_embed_layerlist = [_class_embed for i in range(transformer.num_decoder_layers)]
        else:
            class_embed_layerlist = [copy.deepcopy(_class_embed) for i in range(transformer.num_decoder_layers)]
        self.bbox_embed = nn.ModuleList(box_embed_layerlist)
        self.class_embed = nn.ModuleList(class_embed_layerlist)
        self.transformer.decoder.bbox_embed = self.bbox_embed
        self.transformer.decoder.class_embed = self.class_embed

        # two stage
        self.two_stage_type = two_stage_type
        assert two_stage_type == 'standard', "trimmed: two_stage_type 'standard' only"
        if two_stage_bbox_embed_share:
            assert dec_pred_class_embed_share and dec_pred_bbox_embed_share
            self.transformer.enc_out_bbox_embed = _bbox_embed
        else:
            self.transformer.enc_out_bbox_embed = copy.deepcopy(_bbox_embed)

        if two_stage_class_embed_share:
            assert dec_pred_class_embed_share and dec_pred_bbox_embed_share
            self.transformer.enc_out_class_embed = _class_embed
        else:
            self.transformer.enc_out_class_embed = copy.deepcopy(_class_embed)
        self.refpoint_embed = None

        self.decoder_sa_type = decoder_sa_type
        assert decoder_sa_type == 'sa'
        for layer in self.transformer.decoder.layers:
            layer.label_embedding = None
        self.label_embedding = None

        self._reset_parameters()

    def _reset_parameters(self):
        # init input_proj
        for proj in self.input_proj:
            nn.init.xavier_uniform_(proj[0].weight, gain=1)
            nn.init.constant_(proj[0].bias, 0)

    def forward(self, samples: NestedTensor, targets:List=None):
        features, poss = self.backbone(samples)

        srcs = []
        masks = []
        for l, feat in enumerate(features):
            src, mask = feat.decompose()
            srcs.append(self.input_proj[l](src))
            masks.append(mask)
            assert mask is not None
        if self.num_feature_levels > len(srcs):
            _len_srcs = len(srcs)
            for l in range(_len_srcs, self.num_feature_levels):
                if l == _len_srcs:
                    src = self.input_proj[l](features[-1].tensors)
                else:
                    src = self.input_proj[l](srcs[-1])
                m = samples.mask
                mask = F.interpolate(m[None].float(), size=src.shape[-2:]).to(torch.bool)[0]
                pos_l = self.backbone[1](NestedTensor(src, mask)).to(src.dtype)
                srcs.append(src)
                masks.append(mask)
                poss.append(pos_l)

        if self.dn_number > 0 or targets is not None:
            input_query_label, input_query_bbox, attn_mask, dn_meta =\
                prepare_for_cdn(dn_args=(targets, self.dn_number, self.dn_label_noise_ratio, self.dn_box_noise_scale),
                                training=self.training,num_queries=self.num_queries,num_classes=self.num_classes,
                                hidden_dim=self.hidden_dim,label_enc=self.label_enc)
        else:
            assert targets is None
            input_query_bbox = input_query_label = attn_mask = dn_meta = None

        hs, reference, hs_enc, ref_enc, init_box_proposal = self.transformer(srcs, masks, input_query_bbox, poss,input_query_label,attn_mask)
        # In case num object=0
        hs[0] += self.label_enc.weight[0,0]*0.0

        # deformable-detr-like anchor update
        outputs_coord_list = []
        for dec_lid, (layer_ref_sig, layer_bbox_embed, layer_hs) in enumerate(zip(reference[:-1], self.bbox_embed, hs)):
            layer_delta_unsig = layer_bbox_embed(layer_hs)
            layer_outputs_unsig = layer_delta_unsig  + inverse_sigmoid(layer_ref_sig)
            layer_outputs_unsig = layer_outputs_unsig.sigmoid()
            outputs_coord_list.append(layer_outputs_unsig)
        outputs_coord_list = torch.stack(outputs_coord_list)

        outputs_class = torch.stack([layer_cls_embed(layer_hs) for
                                     layer_cls_embed, layer_hs in zip(self.class_embed, hs)])
        out = {'pred_logits': outputs_class[-1], 'pred_boxes': outputs_coord_list[-1]}
        if self.aux_loss:
            out['aux_outputs'] = self._set_aux_loss(outputs_class, outputs_coord_list)

        # for encoder output
        if hs_enc is not None:
            # prepare intermediate outputs
            interm_coord = ref_enc[-1]
            interm_class = self.transformer.enc_out_class_embed(hs_enc[-1])
            out['interm_outputs'] = {'pred_logits': interm_class, 'pred_boxes': interm_coord}
            out['interm_outputs_for_matching_pre'] = {'pred_logits': interm_class, 'pred_boxes': init_box_proposal}

        out['dn_meta'] = dn_meta
        return out

    @torch.jit.unused
    def _set_aux_loss(self, outputs_class, outputs_coord):
        return [{'pred_logits': a, 'pred_boxes': b}
                for a, b in zip(outputs_class[:-1], outputs_coord[:-1])]


class PostProcess(nn.Module):
    """ This module converts the model's output into the format expected by the coco api"""
    def __init__(self, num_select=100, nms_iou_threshold=-1) -> None:
        super().__init__()
        self.num_select = num_select
        self.nms_iou_threshold = nms_iou_threshold

    @torch.no_grad()
    def forward(self, outputs, target_sizes, not_to_xyxy=False, test=False):
        num_select = self.num_select
        out_logits, out_bbox = outputs['pred_logits'], outputs['pred_boxes']

        assert len(out_logits) == len(target_sizes)
        assert target_sizes.shape[1] == 2

        prob = out_logits.sigmoid()
        topk_values, topk_indexes = torch.topk(prob.view(out_logits.shape[0], -1), num_select, dim=1)
        scores = topk_values
        topk_boxes = topk_indexes // out_logits.shape[2]
        labels = topk_indexes % out_logits.shape[2]
        if not_to_xyxy:
            boxes = out_bbox
        else:
            boxes = box_cxcywh_to_xyxy(out_bbox)

        if test:
            assert not not_to_xyxy
            boxes[:,:,2:] = boxes[:,:,2:] - boxes[:,:,:2]
        boxes = torch.gather(boxes, 1, topk_boxes.unsqueeze(-1).repeat(1,1,4))

        # and from relative [0, 1] to absolute [0, height] coordinates
        img_h, img_w = target_sizes.unbind(1)
        scale_fct = torch.stack([img_w, img_h, img_w, img_h], dim=1)
        boxes = boxes * scale_fct[:, None, :]

        if self.nms_iou_threshold > 0:
            item_indices = [torchvision.ops.nms(b, s, iou_threshold=self.nms_iou_threshold) for b,s in zip(boxes, scores)]
            results = [{'scores': s[i], 'labels': l[i], 'boxes': b[i]} for s, l, b, i in zip(scores, labels, boxes, item_indices)]
        else:
            results = [{'scores': s, 'labels': l, 'boxes': b} for s, l, b in zip(scores, labels, boxes)]

        return results


def build_dino(args):
    """The model and post-processor of ``build_dino`` (criterion and matcher left out)."""
    num_classes = args.num_classes
    backbone = build_backbone(args)
    transformer = build_deformable_transformer(args)
    dn_labelbook_size = args.dn_labelbook_size
    model = DINO(
        backbone,
        transformer,
        num_classes=num_classes,
        num_queries=args.num_queries,
        aux_loss=True,
        iter_update=True,
        query_dim=4,
        num_feature_levels=args.num_feature_levels,
        nheads=args.nheads,
        dec_pred_class_embed_share=args.dec_pred_class_embed_share,
        dec_pred_bbox_embed_share=args.dec_pred_bbox_embed_share,
        two_stage_type=args.two_stage_type,
        two_stage_bbox_embed_share=args.two_stage_bbox_embed_share,
        two_stage_class_embed_share=args.two_stage_class_embed_share,
        decoder_sa_type=args.decoder_sa_type,
        num_patterns=args.num_patterns,
        dn_number = args.dn_number if args.use_dn else 0,
        dn_box_noise_scale = args.dn_box_noise_scale,
        dn_label_noise_ratio = args.dn_label_noise_ratio,
        dn_labelbook_size = dn_labelbook_size,
    )
    postprocessors = {'bbox': PostProcess(num_select=args.num_select, nms_iou_threshold=args.nms_iou_threshold)}
    return model, postprocessors


# =========================================================================== config/DINO/DINO_{4,5}scale.py
def dino_args(num_scales: int = 4, **overrides) -> SimpleNamespace:
    """The model settings of ``config/DINO/DINO_4scale.py`` (``num_scales=5``: ``DINO_5scale.py``, which differs
    only in ``return_interm_indices`` [0, 1, 2, 3], ``num_feature_levels`` 5 and the batch size)."""
    if num_scales not in (4, 5):
        raise ValueError(f"DINO's R50 configs have 4 or 5 scales, got {num_scales}")
    args = dict(
        num_classes=91, lr_backbone=1e-05, backbone='resnet50', dilation=False, position_embedding='sine',
        pe_temperatureH=20, pe_temperatureW=20, return_interm_indices=[1, 2, 3] if num_scales == 4 else [0, 1, 2, 3],
        enc_layers=6, dec_layers=6, pre_norm=False, dim_feedforward=2048, hidden_dim=256, dropout=0.0, nheads=8,
        num_queries=900, query_dim=4, num_patterns=0, num_feature_levels=num_scales, enc_n_points=4, dec_n_points=4,
        two_stage_type='standard', two_stage_bbox_embed_share=False, two_stage_class_embed_share=False, num_select=300,
        transformer_activation='relu', decoder_sa_type='sa', decoder_module_seq=['sa', 'ca', 'ffn'],
        nms_iou_threshold=-1, dec_pred_bbox_embed_share=True, dec_pred_class_embed_share=True, use_dn=True,
        dn_number=100, dn_box_noise_scale=0.4, dn_label_noise_ratio=0.5, embed_init_tgt=True, dn_labelbook_size=91,
    )
    args.update(overrides)
    return SimpleNamespace(**args)
