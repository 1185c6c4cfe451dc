"""Check benchmarks/reference_detr_segm.py and visiontf's DETR masks against the ORIGINAL code.

The original is not importable in CI, so the tests compare visiontf with the reference of
``benchmarks/reference_detr_segm.py``; this script checks that reference (and visiontf directly)
against a checkout of facebookresearch/detr and of cocodataset/panopticapi (pure Python; its
``id2rgb``/``rgb2id`` are what ``PostProcessPanoptic`` uses):

    python benchmarks/detr_segm_parity.py --detr /path/to/detr --panopticapi /path/to/panopticapi

It builds the original ``DETRsegm`` (R50 body, a small transformer: d 128, 8 heads, 2+2 layers) with
random weights and prints the largest difference of each output of (a) the reference and (b) visiontf
loaded from the original's state dict; then the post-processors (``PostProcessSegm``,
``PostProcessPanoptic``: PNG bytes and segments), ``loss_masks`` and ``masks_to_boxes`` on the same
random inputs. Exit status 1 when anything differs by more than 1e-4 (1e-5 for the reference).
Without the checkouts it says so and exits 0 (nothing to compare).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = dict(d=128, h=8, ne=2, nd=2, ff=256, nq=10, num_classes=20)


def _randomize(module: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial values everywhere, moderate activations (as tests/test_detr_checkpoints.py)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith("running_mean"):
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
            elif t.dim() == 1 and ("norm" in name or "bn" in name or "downsample.1" in name or ".gn" in name):
                t.copy_((0.5 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(t.shape, generator=g))
            elif name.endswith(("query_embed.weight", "row_embed.weight", "col_embed.weight")):
                t.copy_(torch.randn(t.shape, generator=g))
            else:
                fan = t[0].numel() if t.dim() > 1 else 16
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(max(1, fan)))


def _import_original(detr: Path, panopticapi: Path):
    sys.path.insert(0, str(panopticapi))
    sys.path.insert(0, str(detr))
    import models.backbone as backbone
    import models.segmentation as segmentation
    from models.detr import DETR, SetCriterion
    from models.matcher import HungarianMatcher
    from models.position_encoding import PositionEmbeddingSine
    from models.transformer import Transformer
    from util.box_ops import masks_to_boxes

    backbone.is_main_process = lambda: False  # the original downloads ImageNet weights on the main process
    return dict(backbone=backbone, segmentation=segmentation, DETR=DETR, SetCriterion=SetCriterion,
                HungarianMatcher=HungarianMatcher, PositionEmbeddingSine=PositionEmbeddingSine, Transformer=Transformer,
                masks_to_boxes=masks_to_boxes)


def _original_model(o: dict, dilation: bool = False):
    body = o["backbone"].Backbone("resnet50", train_backbone=True, return_interm_layers=True, dilation=dilation)
    joiner = o["backbone"].Joiner(body, o["PositionEmbeddingSine"](SMALL["d"] // 2, normalize=True))
    joiner.num_channels = body.num_channels
    transformer = o["Transformer"](d_model=SMALL["d"], nhead=SMALL["h"], num_encoder_layers=SMALL["ne"],
                                   num_decoder_layers=SMALL["nd"], dim_feedforward=SMALL["ff"], dropout=0.0,
                                   return_intermediate_dec=True)
    detr = o["DETR"](joiner, transformer, num_classes=SMALL["num_classes"], num_queries=SMALL["nq"], aux_loss=True)
    return o["segmentation"].DETRsegm(detr).eval()


def _diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item() if a.numel() else 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--detr", type=Path, help="a checkout of facebookresearch/detr")
    p.add_argument("--panopticapi", type=Path, help="a checkout of cocodataset/panopticapi")
    args = p.parse_args(argv)
    if not (args.detr and (args.detr / "models" / "segmentation.py").is_file() and args.panopticapi
            and (args.panopticapi / "panopticapi" / "utils.py").is_file()):
        print("no checkouts of facebookresearch/detr and cocodataset/panopticapi given: nothing to compare")
        return 0
    from benchmarks import reference_detr_segm as R

    o = _import_original(args.detr, args.panopticapi)
    torch.manual_seed(0)
    worst: dict[str, float] = {}
    images = torch.randn(2, 3, 96, 128)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, :, 100:] = True
    mask[1, 80:, :] = True
    images[mask[:, None].expand_as(images)] = 0
    from util.misc import NestedTensor

    for dilation in (False, True):
        orig = _original_model(o, dilation)
        _randomize(orig)
        state = orig.state_dict()
        ref = R.OriginalDETRsegm(backbone="resnet50", dilation=dilation, d=SMALL["d"], h=SMALL["h"], ne=SMALL["ne"],
                                 nd=SMALL["nd"], ff=SMALL["ff"], nq=SMALL["nq"], num_classes=SMALL["num_classes"]).eval()
        mine, theirs = set(ref.state_dict()), {k for k in state if not k.endswith("num_batches_tracked")}
        if mine != theirs:
            print(f"key layout differs: only reference {sorted(mine - theirs)[:5]}, only original {sorted(theirs - mine)[:5]}")
            return 1
        ref.load_state_dict(state, strict=False)
        from visiontf.models import create_model

        path = Path(args.detr).parent / "detr_segm_parity_state.pth"
        torch.save({"model": state}, path)
        ours = create_model("detr_resnet50_dc5_panoptic" if dilation else "detr_resnet50_panoptic", pretrained=path,
                            num_classes=SMALL["num_classes"], hidden_dim=SMALL["d"], nheads=SMALL["h"],
                            enc_layers=SMALL["ne"], dec_layers=SMALL["nd"], dim_feedforward=SMALL["ff"],
                            num_queries=SMALL["nq"], dropout=0.0).eval()
        path.unlink()
        with torch.no_grad():
            want = orig(NestedTensor(images, mask))
            got_ref = ref(images, mask)
            got = ours(images, mask)
        tag = "dc5" if dilation else "r50"
        for key in ("pred_logits", "pred_boxes", "pred_masks"):
            worst[f"reference {tag} {key}"] = _diff(got_ref[key], want[key])
            worst[f"visiontf {tag} {key}"] = _diff(got[key], want[key])
        print(f"{tag}: pred_masks {tuple(want['pred_masks'].shape)}, std {want['pred_masks'].std():.3f}")
    outputs = {k: v for k, v in want.items() if k != "aux_outputs"}
    worst.update(_check_postprocess(o, R, outputs))
    worst.update(_check_loss(o, R))
    failed = False
    for name, value in worst.items():
        limit = 1e-5 if name.startswith("reference") else 1e-4
        bad = value > limit
        failed |= bad
        print(f"{name:45s} max |diff| = {value:.3g}{'  > ' + str(limit) if bad else ''}")
    print("FAILED" if failed else "all equal within the tolerances")
    return 1 if failed else 0


def _check_postprocess(o: dict, R, outputs: dict) -> dict[str, float]:
    seg = o["segmentation"]
    out: dict[str, float] = {}
    orig_sizes = torch.tensor([[200, 260], [150, 170]])
    max_sizes = torch.tensor([[96, 128], [80, 100]])
    want = seg.PostProcessSegm()([{}, {}], outputs, orig_sizes, max_sizes)
    got = R.reference_postprocess_segm([{}, {}], outputs, orig_sizes, max_sizes)
    out["reference PostProcessSegm masks"] = max(_diff(w["masks"], g["masks"]) for w, g in zip(want, got))
    from visiontf.detection.mask_postprocess import PostProcessPanoptic, PostProcessSegm

    got = PostProcessSegm()([{}, {}], outputs, orig_sizes, max_sizes)
    out["visiontf PostProcessSegm masks"] = max(_diff(w["masks"], g["masks"]) for w, g in zip(want, got))
    # confident queries, some of stuff classes (ids > 9 here) and several of one stuff class
    logits = outputs["pred_logits"].clone()
    logits[:, :7, 3] += 12.0
    logits[:, 3:6, 12] += 30.0
    logits[0, 7, 15] += 30.0
    panoptic = dict(outputs, pred_logits=logits)
    is_thing = {i: i <= 9 for i in range(logits.shape[-1])}
    sizes = [(96, 128), (96, 128)]
    targets = [(190, 250), (96, 128)]
    want = seg.PostProcessPanoptic(is_thing, threshold=0.85)(panoptic, sizes, targets)
    got = R.reference_postprocess_panoptic(panoptic, sizes, targets, is_thing, threshold=0.85)
    same = all(w["png_string"] == g["png_string"] and w["segments_info"] == g["segments_info"] for w, g in zip(want, got))
    out["reference PostProcessPanoptic (PNG, segments)"] = 0.0 if same else 1.0
    got = PostProcessPanoptic(is_thing, threshold=0.85)(panoptic, sizes, targets)
    same = all(w["png_string"] == g["png_string"] and w["segments_info"] == g["segments_info"] for w, g in zip(want, got))
    out["visiontf PostProcessPanoptic (PNG, segments)"] = 0.0 if same else 1.0
    print("panoptic segments per image:", [len(w["segments_info"]) for w in want])
    return out


def _check_loss(o: dict, R) -> dict[str, float]:
    g = torch.Generator().manual_seed(1)
    pred = {"pred_masks": torch.randn(2, 10, 24, 32, generator=g)}
    targets = [{"masks": (torch.rand(3, 90, 120, generator=g) > 0.5).to(torch.uint8)},
               {"masks": (torch.rand(2, 96, 110, generator=g) > 0.5).to(torch.uint8)}]
    indices = [(torch.tensor([4, 0, 7]), torch.tensor([1, 2, 0])), (torch.tensor([9, 2]), torch.tensor([0, 1]))]
    crit = o["SetCriterion"](20, o["HungarianMatcher"](), {}, 0.1, ["masks"])
    want = crit.loss_masks(pred, targets, indices, 5.0)
    got = R.reference_loss_masks(pred, targets, indices, 5.0)
    out = {f"reference loss_masks {k}": _diff(got[k], want[k]) for k in want}
    from visiontf.detection.mask_losses import loss_masks

    got = loss_masks(pred, targets, indices, 5.0)
    out.update({f"visiontf loss_masks {k}": _diff(got[k], want[k]) for k in want})
    masks = torch.rand(5, 40, 50, generator=g) > 0.7
    out["reference masks_to_boxes"] = _diff(R.reference_masks_to_boxes(masks), o["masks_to_boxes"](masks))
    return out


if __name__ == "__main__":
    sys.exit(main())
