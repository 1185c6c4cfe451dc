"""SETR against mmsegmentation: the published checkpoints' layout key for key, parameter counts, logits and
sliding-window inference of converted weights, inference settings, optimiser groups, bad checkpoints refused.

What mmsegmentation 1.2.2 itself computed is recorded in ``tests/fixtures/setr`` by ``scripts/fixtures/make_setr.py``
(run in a separate environment with mmseg installed): random weights of toy Naive (with mmseg 0.x's patch bias),
PUP and MLA models built from mmseg's own configs, their whole and sliding-window logits in float32 and float64,
a position table resized by mmseg, and the parameter counts of the six published configs with the Cityscapes
keys. ``tests/fixtures/setr/mmseg_setr_state_dicts.txt`` (printed from mmseg 1.2.2, a copy of ``shared/reference/``) is
the ADE20K layout. ``tests/reference/setr_mmseg.py``, the project's own re-creation, remains the oracle
at full ViT-L width (slow) and for writing mmseg-layout files of other widths.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
import torch
from reference.fixtures import FIXTURES, load_fixture

import visiontf.models.setr.setr as setr_module
from visiontf.models import create_model, get_entry, list_models
from visiontf.models.setr.convert import convert_state_dict, fitting_variants, rename_mmseg_keys
from visiontf.models.setr.setr import DEFAULT_CFGS

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # benchmarks/ is not an installed package
from reference.setr_mmseg import build_setr, randomize  # noqa: E402

LISTING = ROOT / "tests" / "fixtures" / "setr" / "mmseg_setr_state_dicts.txt"
COUNTS = FIXTURES / "setr" / "mmseg_layouts.txt"
DECODERS = ("naive", "pup", "mla")
#: mmseg 1.2.2, setr_vit-l_*_ade20k-512x512 configs (the listing's headers)
MMSEG_PARAMS = {"naive": 305_557_592, "pup": 317_290_072, "mla": 309_569_262}
#: the Cityscapes 768 configs, counted by mmseg 1.2.2 (tests/fixtures/setr/mmseg_layouts.txt)
CITYSCAPES_PARAMS = {"naive": 306_535_500, "pup": 318_466_124, "mla": 310_678_111}
#: the fixtures' toy SETR in visiontf's arguments (ViT 4 x 16 dims, 2 heads, 4-px patches, 16-px crop; heads 8 / 4)
TOY = dict(num_classes=2, encoder=dict(img_size=16, out_indices=(0, 1, 2, 3), kwargs=dict(embed_dim=16, depth=4, num_heads=2, patch_size=4)),
           decode_head=dict(channels=8, mla_channels=4))
TOL = {"float32": 1e-4, "float64": 1e-8}  # measured: < 6e-7 and < 1e-15


def parse_listing(path: Path) -> dict[str, dict]:
    """{decoder: {"params", "entries", "keys": {key: shape}}} with ``layers.N ... xK`` expanded."""
    sections: dict[str, dict] = {}
    cur = None
    for line in path.read_text().splitlines():
        head = re.match(r"^## setr_vit-l_(\w+)_8xb2\S+: (\d+) parameters, (\d+) state-dict entries", line)
        if head:
            cur = sections[head.group(1)] = {"params": int(head.group(2)), "entries": int(head.group(3)), "keys": {}}
            continue
        if cur is None or line.startswith("module structure"):
            cur = None
            continue
        m = re.match(r"^(\S+) \[([\d, ]*)\](?:\s+x(\d+))?$", line.rstrip())
        if m:
            shape = tuple(int(x) for x in m.group(2).split(",") if x.strip())
            for i in range(int(m.group(3) or 1)):
                cur["keys"][m.group(1).replace(".N.", f".{i}.") if m.group(3) else m.group(1)] = shape
    return sections


LISTED = parse_listing(LISTING)


def parse_counts(path: Path) -> tuple[dict[tuple[str, str], tuple[int, int]], dict[str, dict[str, tuple[int, ...]]]]:
    """mmseg_layouts.txt: {(decoder, dataset): (parameters, entries)} and the Cityscapes keys {decoder: {key: shape}}."""
    counts, keys, cur = {}, {}, None
    for line in path.read_text().splitlines():
        row = re.match(r"^(naive|pup|mla) (ade20k|cityscapes) \S+: (\d+) parameters, (\d+) state-dict entries$", line)
        if row:
            counts[(row.group(1), row.group(2))] = (int(row.group(3)), int(row.group(4)))
            continue
        head = re.match(r"^## setr_vit-l_(\w+)_8xb1-80k_cityscapes", line)
        if head:
            cur = keys[head.group(1)] = {}
            continue
        m = re.match(r"^(\S+) \[([\d, ]*)\](?:\s+x(\d+))?$", line)
        if cur is not None and m:
            shape = tuple(int(x) for x in m.group(2).split(",") if x.strip())
            for i in range(int(m.group(3) or 1)):
                cur[m.group(1).replace(".N.", f".{i}.", 1) if m.group(3) else m.group(1)] = shape
    return counts, keys


MMSEG_COUNTS, CITYSCAPES_KEYS = parse_counts(COUNTS)


def listed_state(decoder: str, dataset: str = "ade20k") -> dict[str, torch.Tensor]:
    """mmseg's published layout as meta tensors (shapes only)."""
    keys = LISTED[decoder]["keys"] if dataset == "ade20k" else CITYSCAPES_KEYS[decoder]
    return {k: torch.empty(shape, device="meta") for k, shape in keys.items()}


def _fixture_file(tmp_path: Path, decoder: str) -> Path:
    """The fixture's weights as mmseg's model zoo publishes a checkpoint: ``{"meta": ..., "state_dict": ...}``."""
    state = {k: v.float() if v.is_floating_point() else v for k, v in load_fixture("setr", decoder).weights.items()}
    return _mmseg_file(tmp_path, state)


def _shapes(module_or_state) -> dict[str, tuple[int, ...]]:
    state = module_or_state.state_dict() if isinstance(module_or_state, torch.nn.Module) else module_or_state
    return {k: tuple(v.shape) for k, v in state.items()}


def _meta(fn, *args, **kwargs):
    with torch.device("meta"):
        return fn(*args, **kwargs)


def _mmseg_file(tmp_path: Path, ref, name: str = "mmseg.pth") -> Path:
    """An mmseg checkpoint file: ``{"meta": ..., "state_dict": ...}`` as its model zoo publishes."""
    path = tmp_path / name
    meta = {"mmseg_version": "1.2.2", "CLASSES": ["a", "b"], "iter": 160000, "config": "model = dict(...)"}
    torch.save({"meta": meta, "state_dict": ref.state_dict() if isinstance(ref, torch.nn.Module) else ref}, path)
    return path


# ------------------------------------------------------------------------------------------ layout
def test_listing_copy_is_the_shared_one():
    shared = ROOT.parent / "shared" / "reference" / LISTING.name
    if not shared.is_file():
        pytest.skip(f"{shared} absent (CI without shared/ beside the clone); tests use the copy in tests/fixtures/setr")
    assert shared.read_text() == LISTING.read_text()


@pytest.mark.parametrize("decoder", DECODERS)
def test_reference_is_mmseg_key_for_key(decoder):
    """The own-words reference (the full-width oracle below) has mmseg's layout, ADE20K and Cityscapes."""
    listed = LISTED[decoder]
    ref = _meta(build_setr, decoder)
    assert _shapes(ref) == listed["keys"]
    assert len(listed["keys"]) == listed["entries"] == MMSEG_COUNTS[(decoder, "ade20k")][1]
    assert sum(p.numel() for p in ref.parameters()) == listed["params"] == MMSEG_PARAMS[decoder]
    assert _shapes(_meta(build_setr, decoder, "cityscapes")) == CITYSCAPES_KEYS[decoder]


@pytest.mark.parametrize("decoder", DECODERS)
def test_setr_has_mmseg_structure_and_parameter_count(decoder):
    ours = _meta(create_model, f"setr_{decoder}_vit_large_patch16")
    assert sum(p.numel() for p in ours.parameters()) == MMSEG_PARAMS[decoder] == MMSEG_COUNTS[(decoder, "ade20k")][0]
    assert len(ours.state_dict()) == LISTED[decoder]["entries"]
    # every listed key has exactly one counterpart of the same shape, and nothing is left over
    converted = convert_state_dict(listed_state(decoder), ours)
    assert _shapes(converted) == _shapes(ours)


@pytest.mark.parametrize("decoder", DECODERS)
def test_cityscapes_variants_are_mmseg_cityscapes_configs(decoder):
    ours = _meta(create_model, f"setr_{decoder}_vit_large_patch16_cityscapes")
    params, entries = MMSEG_COUNTS[(decoder, "cityscapes")]
    assert sum(p.numel() for p in ours.parameters()) == params == CITYSCAPES_PARAMS[decoder]
    assert len(CITYSCAPES_KEYS[decoder]) == entries
    assert _shapes(convert_state_dict(listed_state(decoder, "cityscapes"), ours)) == _shapes(ours)
    assert ours.num_classes == 19 and ours.encoder.pos_embed.shape == (1, 48 * 48 + 1, 1024)
    ade = _meta(create_model, f"setr_{decoder}_vit_large_patch16")
    if decoder == "naive":  # the one structural difference: one conv per auxiliary head instead of two
        assert [len(h.up_convs) for h in ours.aux_heads] == [1, 1, 1]
        assert [len(h.up_convs) for h in ade.aux_heads] == [2, 2, 2]


def test_every_setr_name_is_one_explicit_registered_function():
    source = Path(setr_module.__file__).read_text()
    names = list_models("setr_*")
    assert sorted(names) == sorted(DEFAULT_CFGS) and len(names) == 12
    for name in names:
        assert re.search(rf"^@register_model\(.*\)\ndef {name}\(", source, re.M), name
        assert "segmentation" in get_entry(name).tags
        assert get_entry(name).filter_fn is convert_state_dict


# ------------------------------------------------------------------------------------------ logits
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("decoder", DECODERS)
def test_converted_checkpoint_gives_mmseg_logits(decoder, dtype, tmp_path):
    fx = load_fixture("setr", decoder)
    ours = create_model(f"setr_{decoder}_vit_large_patch16", pretrained=str(_fixture_file(tmp_path, decoder)), **TOY).eval()
    folded = TOY["encoder"]["kwargs"]["embed_dim"] if fx.meta["settings"]["patch_bias"] else 0  # into pos_embed
    assert sum(p.numel() for p in ours.parameters()) == fx.meta["params"] - folded
    ours, want, tol = ours.to(getattr(torch, dtype)), fx.outputs[dtype], TOL[dtype]
    x = {k: v.to(getattr(torch, dtype)) for k, v in fx.inputs.items()}
    with torch.no_grad():
        # the crop; a size that is no multiple of the patch (corner padding, pos_embed resized, logits resized back)
        for name in ("crop", "odd"):
            got = ours(x[name])
            assert got.shape == want[f"whole_{name}"].shape == (1, 2, *x[name].shape[2:])
            assert (got - want[f"whole_{name}"]).abs().max().item() < tol, name
            assert (ours.inference(x[name], "whole") - want[f"whole_{name}"]).abs().max().item() < tol
        # sliding windows (crop 16, stride 11): overlaps averaged with count_mat, the last window shifted back
        slide = ours.inference(x["large"], "slide", crop=16, stride=11)
        assert (slide - want["slide_large"]).abs().max().item() < tol
        # one window covering the image: slide is whole
        torch.testing.assert_close(ours.inference(x["crop"], "slide", crop=16, stride=11), ours.inference(x["crop"], "whole"),
                                   atol=1e-6, rtol=0)


def test_patch_bias_of_mmseg0_trained_checkpoints_is_folded_exactly(tmp_path):
    # mmseg 0.x (which trained the published weights) had a patch-embedding bias; 1.x's ViT and ours have none;
    # the naive fixture was recorded with mmseg's ViT(patch_bias=True)
    fx = load_fixture("setr", "naive")
    assert fx.meta["settings"]["patch_bias"] and "backbone.patch_embed.projection.bias" in fx.weights
    ours = create_model("setr_naive_vit_large_patch16", pretrained=str(_fixture_file(tmp_path, "naive")), **TOY).eval()
    assert ours.encoder.patch_embed.proj.bias is None
    with torch.no_grad():  # a padded border patch too: the bias applies to every patch token alike
        assert (ours(fx.inputs["odd"].float()) - fx.outputs["float32"]["whole_odd"]).abs().max().item() < TOL["float32"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pos_embed_resized_when_the_crop_differs(tmp_path, dtype):
    """A 16-px checkpoint into a 20-px model: mmseg's resize_pos_embed, and its 20-px model's logits."""
    fx = load_fixture("setr", "naive")
    want, tol = fx.outputs[dtype], TOL[dtype]
    ours = create_model("setr_naive_vit_large_patch16", pretrained=str(_fixture_file(tmp_path, "naive")),
                        **{**TOY, "encoder": {**TOY["encoder"], "img_size": 20}}).eval()
    assert ours.encoder.pos_embed.shape == (1, 26, 16)
    # mmseg's table, with the naive fixture's patch-embedding bias folded into its patch rows (not the class row)
    bias = load_fixture("setr", "naive").weights["backbone.patch_embed.projection.bias"].to(want["resized_pos_embed"].dtype)
    expected = want["resized_pos_embed"] + torch.cat([torch.zeros(1, 16, dtype=bias.dtype), bias.expand(25, 16)])
    # the converter resizes the float32 table once; mmseg resized it in each dtype
    assert (ours.encoder.pos_embed.detach() - expected).abs().max().item() < TOL["float32"]
    ours = ours.to(getattr(torch, dtype))
    ours.encoder.pos_embed.data.copy_(expected)
    with torch.no_grad():
        assert (ours(fx.inputs["resized"].to(getattr(torch, dtype))) - want["resized_whole"]).abs().max().item() < tol


@pytest.mark.slow
def test_vit_large_logits_equal_mmseg_encode_decode():
    """Full ViT-L PUP in float32 (317M parameters, built without default init). ~25 s on 2 shared cores."""
    t0 = time.perf_counter()
    ref = _meta(build_setr, "pup").to_empty(device="cpu").eval()
    randomize(ref)
    ours = _meta(create_model, "setr_pup_vit_large_patch16").to_empty(device="cpu")
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours))
    ours.eval()
    x = torch.randn(1, 3, 256, 256)  # 16x16 tokens: pos_embed resized from 32x32 by both
    with torch.no_grad():
        expected = ref.encode_decode(x)
        got = ours(x)
    assert expected.dtype == got.dtype == torch.float32
    assert (got - expected).abs().max().item() < 1e-3, (got - expected).abs().max().item()
    print(f"ViT-L PUP parity: max |diff| {(got - expected).abs().max().item():.2e}, {time.perf_counter() - t0:.1f} s")


# ------------------------------------------------------------------------------------------ settings
def test_pretrained_cfg_carries_mmseg_test_settings():
    ade = _meta(create_model, "setr_pup_vit_large_patch16").pretrained_cfg
    assert [round(m * 255, 3) for m in ade.mean] == [123.675, 116.28, 103.53]
    assert [round(s * 255, 3) for s in ade.std] == [58.395, 57.12, 57.375]
    assert (ade.test_mode, ade.crop_size, ade.stride, ade.resize) == ("slide", (512, 512), (341, 341), (2048, 512))
    city = _meta(create_model, "setr_mla_vit_large_patch16_cityscapes").pretrained_cfg
    assert (city.test_mode, city.crop_size, city.stride, city.resize) == ("slide", (768, 768), (512, 512), (2049, 1025))
    tiny = create_model("setr_naive_vit_tiny_patch16", encoder={"img_size": 64, "kwargs": {"depth": 4}}).pretrained_cfg
    assert (tiny.test_mode, tiny.crop_size, tiny.stride, tiny.resize) == ("whole", (64, 64), (42, 42), None)


@pytest.mark.parametrize("decoder", DECODERS)
def test_param_groups_give_the_segmentation_tasks_split(decoder):
    from visiontf.tasks.segmentation.segmentation_task import SegmentationTask

    task = SegmentationTask(f"setr_{decoder}_vit_tiny_patch16", num_classes=3, lr=0.001, head_lr_mult=10.0,
                            model_kwargs={"encoder": {"img_size": 32, "kwargs": {"depth": 4}}})
    opt = task.configure_optimizers()["optimizer"]  # the task's own rule (backbone_prefixes)
    by_group = {g: {id(p) for n, p in task.model.named_parameters() if task.model.param_group(n) == g} for g in ("encoder", "head")}
    assert [{id(p) for p in g["params"]} for g in opt.param_groups] == [by_group["encoder"], by_group["head"]]
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.001, 0.01])
    # and mmseg's rule, paramwise_cfg custom_keys={"head": lr_mult=10}, on the ViT-L names
    big = _meta(create_model, f"setr_{decoder}_vit_large_patch16")
    for name, _ in big.named_parameters():
        assert (big.param_group(name) == "head") == ("head" in name), name
    assert big.no_weight_decay() == {"encoder.pos_embed", "encoder.cls_token"}


# ------------------------------------------------------------------------------------------ bad input
def test_cityscapes_checkpoint_into_ade20k_model_names_classes_and_fix():
    ours = _meta(create_model, "setr_pup_vit_large_patch16")
    ours.model_name = "setr_pup_vit_large_patch16"
    cityscapes = listed_state("pup", "cityscapes")
    with pytest.raises(ValueError, match=r"19 classes .* has 150: .*setr_pup_vit_large_patch16_cityscapes.*new_classifier=True"):
        convert_state_dict(cityscapes, ours)
    # Naive's Cityscapes auxiliary heads differ too: the layout error names the variant it fits
    naive = _meta(create_model, "setr_naive_vit_large_patch16")
    with pytest.raises(ValueError, match=r"auxiliary heads of 1 x 1x1 conv.*fits setr_naive_vit_large_patch16_cityscapes"):
        convert_state_dict(listed_state("naive", "cityscapes"), naive)


@pytest.mark.parametrize(("theirs", "ours"), [("naive", "pup"), ("mla", "naive"), ("pup", "mla")])
def test_checkpoint_of_another_decoder_names_the_variant_it_fits(theirs, ours):
    model = _meta(create_model, f"setr_{ours}_vit_large_patch16")
    checkpoint = listed_state(theirs)
    title = {"naive": "Naive", "pup": "PUP", "mla": "MLA"}[theirs]
    with pytest.raises(ValueError, match=rf"is SETR-{title}.*fits setr_{theirs}_vit_large_patch16:"):
        convert_state_dict(checkpoint, model)
    assert fitting_variants(rename_mmseg_keys(checkpoint))[0] == f"setr_{theirs}_vit_large_patch16"


def test_old_mmseg_0x_and_unknown_layouts_are_refused():
    model = _meta(create_model, "setr_naive_vit_large_patch16")
    old = {"backbone.patch_embed.proj.weight": torch.zeros(1024, 3, 16, 16),
           "backbone.blocks.0.attn.qkv.weight": torch.zeros(3072, 1024), "decode_head.conv_0.weight": torch.zeros(256, 1024, 1, 1)}
    with pytest.raises(ValueError, match=r"0\.x / original SETR .*backbone\.layers\.N.*model zoo"):
        convert_state_dict({"meta": {}, "state_dict": old}, model)
    final_norm = {**listed_state("naive"), "backbone.ln1.weight": torch.zeros(1024)}
    with pytest.raises(ValueError, match=r"no counterpart in SETR.*backbone\.ln1\.weight"):
        convert_state_dict(final_norm, model)
    with pytest.raises(ValueError, match="unrecognised SETR checkpoint layout"):
        convert_state_dict({"stem.weight": torch.zeros(3)}, model)


def test_class_count_adapts_only_when_asked(tmp_path):
    path = _fixture_file(tmp_path, "pup")
    with pytest.raises(ValueError, match=r"2 classes .* has 7: for its own classes pass num_classes=2.*new_classifier=True"):
        create_model("setr_pup_vit_large_patch16", pretrained=str(path), **{**TOY, "num_classes": 7})
    tuned = create_model("setr_pup_vit_large_patch16", pretrained=str(path), new_classifier=True, **{**TOY, "num_classes": 7})
    theirs = convert_state_dict({k: v.float() for k, v in load_fixture("setr", "pup").weights.items()}, tuned)
    for key, value in tuned.state_dict().items():
        if ".cls_seg." in key:
            assert value.shape[0] == 7  # a new classifier at init
        else:
            assert torch.equal(value, theirs[key]), key


# ------------------------------------------------------------------------------------------ tools/eval.py
@pytest.mark.slow
def test_eval_command_reads_an_mmseg_checkpoint(tmp_path):
    """docs/segmentation.md's command on the synthetic set with a tiny random mmseg-layout checkpoint."""
    from visiontf.cli import eval_main
    from visiontf.tasks.segmentation.segmentation_synthetic import make_segmentation_dataset

    root = make_segmentation_dataset(tmp_path / "seg", num_train=2, num_val=2, num_classes=4, image_size=(64, 64))
    # mmseg's layout for configs/setr/setr_tiny_synthetic.yaml's model (ViT-Ti width, 4 blocks, 8-px patches)
    ref = build_setr("naive", embed_dims=192, num_layers=4, num_heads=3, patch_size=8, out_indices=(0, 1, 2, 3),
                     channels=64, img_size=64, num_classes=4, patch_bias=True)
    randomize(ref)
    ckpt = _mmseg_file(tmp_path, ref)
    out = tmp_path / "stats.json"
    eval_main(["--config", str(ROOT / "configs/setr/setr_tiny_synthetic.yaml"), f"--model.init_args.pretrained={ckpt}",
               f"--data.init_args.root={root}", "--data.init_args.num_workers=0", "--trainer.logger=false",
               f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.enable_progress_bar=false", "--output", str(out)])
    stats = json.loads(out.read_text())
    assert 0.0 <= stats["val/mIoU"] <= 1.0 and "mIoU" in stats
