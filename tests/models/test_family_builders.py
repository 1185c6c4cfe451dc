"""The builders of the ViT, IPT and VQGAN families (``visiontf/models/{vit,ipt,vqgan}/build.py``): a registered variant
is its data plus a call of the builder, and the builder gives what the class gives from the same keywords."""
from __future__ import annotations

import pytest
import torch

from visiontf.models import create_model
from visiontf.models.ipt.build import build_ipt, tasks_of_scale
from visiontf.models.ipt.ipt import DEFAULT_CFGS as IPT_CFGS
from visiontf.models.ipt.ipt import IPT
from visiontf.models.vit.build import VIT_SIZES, vit_variant
from visiontf.models.vit.vit import DEFAULT_CFGS as VIT_CFGS
from visiontf.models.vit.vit import VisionTransformer
from visiontf.models.vqgan.build import build_first_stage
from visiontf.models.vqgan.gpt import Net2NetTransformer

TINY_VQ = dict(n_embed=16, embed_dim=8, ch=32, ch_mult=(1, 1, 1), num_res_blocks=1, attn_resolutions=(4,), resolution=16, z_channels=8)


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_vit_variant_is_its_size_row_read_by_field_name():
    cfg = vit_variant("deit_small_distilled_patch16_224", "small", 16, 224, distilled=True, crop_pct=0.875)
    assert cfg.kwargs == dict(embed_dim=384, depth=12, num_heads=6, patch_size=16, img_size=224, distilled=True)
    assert cfg.pretrained_cfg.hf_hub_id == "deit_small_distilled_patch16_224" and cfg.pretrained_cfg.crop_pct == 0.875
    assert VIT_CFGS["vit_large_patch32_384"].kwargs["depth"] == VIT_SIZES["large"].depth == 24


def test_registered_vit_equals_the_class_built_from_the_same_keywords():
    small = dict(embed_dim=32, depth=2, num_heads=2, img_size=32)
    torch.manual_seed(0)
    registered = create_model("vit_tiny_patch16_224", **small, drop_path_rate=0.1)
    torch.manual_seed(0)
    direct = VisionTransformer(**{**VIT_CFGS["vit_tiny_patch16_224"].kwargs, **small}, drop_path_rate=0.1)
    assert _same(registered, direct)
    assert registered.pretrained_cfg.hf_hub_id == "vit_tiny_patch16_224.augreg_in21k_ft_in1k"


def test_ipt_builder_reads_scale_as_the_task_unless_tasks_are_given():
    small = dict(n_feats=8, num_layers=1, num_heads=2)
    assert build_ipt(IPT, IPT_CFGS["ipt_tiny"], scale=3, **small).tasks == ("sr_x3",)
    assert build_ipt(IPT, IPT_CFGS["ipt_tiny"], scale=1, **small).tasks == ("restore",)
    assert build_ipt(IPT, IPT_CFGS["ipt_tiny"], scale=3, tasks=("derain",), **small).tasks == ("derain",)
    assert create_model("ipt_tiny", scale=4, **small).scales == (4,)
    with pytest.raises(ValueError, match="scale must be >= 1"):
        tasks_of_scale(0)


def test_vqgan_transformer_builds_its_first_stage_by_name_before_the_gpt():
    gpt = dict(n_layer=1, n_head=2, n_embd=32, block_size=16)
    torch.manual_seed(0)
    by_name = create_model("vqgan_transformer_tiny", first_stage_kwargs=TINY_VQ, **gpt)
    torch.manual_seed(0)
    first = create_model("vqgan_tiny", **TINY_VQ)
    injected = Net2NetTransformer(first, **gpt, vocab_size=16)
    assert _same(by_name, injected)
    assert by_name.transformer.vocab_size == 16 and not by_name.first_stage_model.training


def test_first_stage_refuses_keywords_for_a_built_one_and_a_name_that_is_no_tokenizer():
    first = create_model("vqgan_tiny", **TINY_VQ)
    assert build_first_stage(first) is first
    with pytest.raises(ValueError, match="a built first stage takes none"):
        build_first_stage(first, {"n_embed": 8})
    with pytest.raises(ValueError, match="not a registered tokenizer"):
        build_first_stage("ipt_tiny", {"n_feats": 8, "num_layers": 1, "num_heads": 2})
