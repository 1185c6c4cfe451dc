"""D-FINE and DEIM in visiontf's detection task: their own loss without flags, a training step reaching every parameter,
fine-tuning to other classes, the HGNetv2 backbone names, and the configs of the originals' recipes under
``configs/dfine/`` and ``configs/deim/`` (schedule, optimiser, EMA, batch, the stop of the strong augmentation)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rtdetr_helpers import one_thread  # noqa: F401 (a module fixture: one torch thread)

from visiontf.core.config_files import read_config
from visiontf.models import create_model
from visiontf.set_prediction.fine_grained import FineGrainedCriterion
from visiontf.tasks.detection.detection_task import DetectionTask

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
BACKBONE = {"stem": (4, 4), "stages": ((4, 4, 8, 1, False, False, 3, 1), (8, 4, 16, 1, True, False, 3, 1), (16, 8, 24, 1, True, True, 5, 1),
                                       (24, 8, 32, 1, True, True, 5, 1))}
TINY = {"backbone": {"kwargs": BACKBONE}, "encoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32},
        "decoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32, "num_queries": 20, "num_layers": 3}, "denoising": {"num_denoising": 4}}
#: (epochs, lr, backbone lr, weight decay, warm-up steps, per-GPU batch, strong augmentation epochs) of the originals' recipes
DFINE = {"n": (160, 8e-4, 4e-4, 1e-4, 500, 32, [0, 148]), "s": (132, 2e-4, 1e-4, 1e-4, 500, 8, [0, 120]),
         "m": (132, 2e-4, 2e-5, 1e-4, 500, 8, [0, 120]), "l": (80, 2.5e-4, 1.25e-5, 1.25e-4, 500, 8, [0, 72]),
         "x": (80, 2.5e-4, 2.5e-6, 1.25e-4, 500, 8, [0, 72])}
#: DEIM's: (epochs, lr, backbone lr, weight decay, per-GPU batch, its policy epochs [start, mosaic stop, stop])
DEIM = {"n": (160, 8e-4, 4e-4, 1e-4, 32, (4, 78, 148)), "s": (132, 4e-4, 2e-4, 1e-4, 8, (4, 64, 120)), "m": (102, 4e-4, 4e-5, 1e-4, 8, (4, 49, 90)),
        "l": (58, 5e-4, 2.5e-5, 1.25e-4, 8, (4, 29, 50)), "x": (58, 5e-4, 5e-6, 1.25e-4, 8, (4, 29, 50))}


def _batch():
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 96, 128, generator=g)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, :, 96:] = True
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])}]
    return images, mask, targets


@pytest.mark.parametrize("name", ["dfine_s", "deim_dfine_n"])
def test_task_trains_with_the_familys_loss_and_groups(name):
    task = DetectionTask(name, num_classes=3, model_kwargs=TINY, lr=1e-3, lr_backbone=2e-4)
    assert isinstance(task.criterion, FineGrainedCriterion)
    assert task.criterion.class_loss == ("mal" if name.startswith("deim") else "vfl")
    groups = task.configure_optimizers()["optimizer"].param_groups
    assert [g["lr"] for g in groups] == [1e-3, 2e-4]  # default, backbone
    task.train()
    loss = task.training_step(_batch(), 0)
    assert torch.isfinite(loss)
    loss.backward()
    # every trainable parameter gets a gradient (DDP runs without find_unused_parameters); up and reg_scale are fixed
    missing = [n for n, p in task.model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing
    assert not task.model.decoder.up.requires_grad and not task.model.decoder.reg_scale.requires_grad


def test_the_eval_step_scores_each_image_with_the_same_criterion():
    task = DetectionTask("dfine_s", num_classes=3, model_kwargs=TINY).eval()
    images, mask, targets = _batch()
    with torch.no_grad():
        out = task.model(images, mask)
        terms = task.criterion(out, targets, sync_num_boxes=False)
    assert set(out) == {"pred_logits", "pred_boxes"} and torch.isfinite(terms["loss"])
    assert "loss_fgl" not in terms  # no edge logits in evaluation outputs: their terms are training's


def test_finetuning_to_other_classes_keeps_all_but_the_class_tensors(tmp_path):
    source = create_model("dfine_s", num_classes=3, **TINY)
    torch.save(source.state_dict(), tmp_path / "weights.pth")
    model = create_model("dfine_s", pretrained=str(tmp_path / "weights.pth"), num_classes=7, **TINY)
    own, theirs = model.state_dict(), source.state_dict()
    changed = {k for k in own if own[k].shape != theirs[k].shape or not torch.equal(own[k], theirs[k])}
    assert changed and all(k.startswith(model.head_prefixes) for k in changed)
    assert model.decoder.score_heads[0].out_features == 7 and model.decoder.lqe_layers[0].reg_conf.layers[-1].out_features == 1


def test_fused_repvgg_blocks_give_the_same_outputs():
    model = create_model("dfine_s", num_classes=3, **TINY).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(m.running_var, 0.5, 1.5)
            torch.nn.init.normal_(m.running_mean, std=0.1)
    images, mask, _ = _batch()
    with torch.no_grad():
        before = model(images, mask)
        assert model.fuse_repvgg() == 8  # 4 CSP-ELAN blocks x 2 branches x round(3 * 0.34) RepVGG blocks
        after = model(images, mask)
    assert (before["pred_logits"] - after["pred_logits"]).abs().max() < 1e-4
    assert (before["pred_boxes"] - after["pred_boxes"]).abs().max() < 1e-5


def test_hgnetv2_is_a_backbone_name_of_every_detector():
    from visiontf.models.backbones.build import build_backbone

    backbone = build_backbone("hgnetv2_b0", num_levels=3, freeze_stem=True)
    assert backbone.channels == [256, 512, 1024] and backbone.strides == [8, 16, 32]
    assert {n.split(".")[0] for n, p in backbone.body.named_parameters() if not p.requires_grad} == {"stem"}
    assert any(n.endswith("lab.scale") for n, _ in backbone.body.named_parameters())  # B0 trains with the affine blocks


@pytest.mark.parametrize("size", sorted(DFINE))
def test_dfine_recipes_follow_the_original(size):
    epochs, lr, lr_backbone, wd, warmup, per_gpu, strong = DFINE[size]
    cfg = read_config(CONFIGS / "dfine" / f"dfine_hgnetv2_{size}_coco.yaml")
    trainer, args, data = cfg["trainer"], cfg["model"]["init_args"], cfg["data"]["init_args"]
    assert trainer["max_epochs"] == epochs and trainer["gradient_clip_val"] == 0.1 and trainer["sync_batchnorm"]
    assert trainer["precision"] == "16-mixed" and trainer["devices"] * data["batch_size"] == 4 * per_gpu
    assert (args["lr"], args["lr_backbone"], args["weight_decay"], args["schedule"], args["warmup_steps"]) == (lr, lr_backbone, wd, "constant", warmup)
    ema = next(c for c in trainer["callbacks"] if c["class_path"].endswith("ModelEMA"))["init_args"]
    # the restart at the end of the strong augmentation (D-FINE's stop_epoch, its ema_restart_decay read by nothing)
    assert ema == {"decay": 0.9999, "warmup_steps": 1000, "restart_epoch": strong[1]}
    assert data["strong_aug_epochs"] == strong and args["model_name"] == f"dfine_{size}"
    assert data["scales"] == ([640] if size == "n" else [480, 512, 544, 576, 608] + [640] * {"s": 20, "m": 6, "l": 4, "x": 3}[size]
                              + [800, 768, 736, 704, 672])
    with torch.device("meta"):
        create_model(args["model_name"], **{k: v for k, v in args["model_kwargs"].items() if k != "backbone"})


@pytest.mark.parametrize("size", sorted(DEIM))
def test_deim_recipes_follow_the_original(size):
    epochs, lr, lr_backbone, wd, per_gpu, (start, mosaic_stop, stop) = DEIM[size]
    cfg = read_config(CONFIGS / "deim" / f"deim_dfine_hgnetv2_{size}_coco.yaml")
    trainer, args, data = cfg["trainer"], cfg["model"]["init_args"], cfg["data"]["init_args"]
    assert trainer["max_epochs"] == epochs and trainer["devices"] * data["batch_size"] == 4 * per_gpu
    assert (args["lr"], args["lr_backbone"], args["weight_decay"], args["warmup_steps"]) == (lr, lr_backbone, wd, 2000)
    assert (data["mosaic"], data["mosaic_epochs"], data["strong_aug_epochs"]) == (0.5, [start, mosaic_stop], [start, stop])
    assert data["mixup"] == {"prob": 0.5, "epochs": [start, mosaic_stop]}  # its collate's mixup_prob and mixup_epochs
    ema = next(c for c in trainer["callbacks"] if c["class_path"].endswith("ModelEMA"))["init_args"]
    assert ema == {"decay": 0.9999, "warmup_steps": 1000, "restart_epoch": stop}
    assert args["model_name"] == f"deim_dfine_{size}"


def test_tiny_shapes_config_builds_its_task():
    cfg = read_config(CONFIGS / "dfine" / "dfine_tiny_shapes.yaml")
    args = cfg["model"]["init_args"]
    task = DetectionTask(args["model_name"], num_classes=3, model_kwargs=args["model_kwargs"], set_loss=args["set_loss"],
                         lr=args["lr"], lr_backbone=args["lr_backbone"])
    options = task.model.decoder.options
    assert options.num_queries == 50 and task.model.denoising.num_denoising == 50
    assert options.distinct_query_iou == 0.8 and options.distinct_between_layers
    assert isinstance(task.criterion, FineGrainedCriterion) and task.criterion.reg_max == 16
    # the config's matcher: class cost 4, the rest D-FINE's (L1 5, GIoU 2)
    matcher = task.criterion.matcher
    assert (matcher.cost_class, matcher.cost_bbox, matcher.cost_giou) == (4.0, 5.0, 2.0)


def test_dfine_denoising_makes_crossed_boxes_sizes_positive():
    """D-FINE's generator takes the absolute value of a noised box's size where its corners crossed; RT-DETR's leaves the
    negative size to the inverse sigmoid's clamp (a box of no width)."""
    from visiontf.models.deformable_detr.denoising import build_contrastive_denoising

    targets = [{"labels": torch.tensor([0, 1, 2]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.1], [0.7, 0.3, 0.3, 0.2]])}]
    draw = lambda flip: build_contrastive_denoising(targets, 3, 10, 30, 0.5, 1.0, generator=torch.Generator().manual_seed(0),  # noqa: E731
                                                    inverse_sigmoid_eps=1e-5, pad_box="zero", flip_negative_sizes=flip)
    clamped, flipped = draw(False), draw(True)
    sizes = lambda dn: dn.boxes_unact[dn.meta.valid][:, 2:].sigmoid()  # noqa: E731
    crossed = sizes(clamped) < 1e-4  # sizes the clamp set to (about) zero
    assert crossed.any() and (sizes(flipped)[crossed] > 1e-3).all()
    assert torch.allclose(sizes(flipped)[~crossed], sizes(clamped)[~crossed])
    model = create_model("dfine_s", num_classes=3, **TINY)
    assert model.denoising.flip_negative_sizes and not create_model("rtdetr_tiny", num_classes=3).denoising.flip_negative_sizes
