"""RT-DETR in visiontf's detection task: its own loss without flags, its learning-rate groups, a training step, and
the configs of the originals' recipes (schedule, optimiser, EMA, batch) under ``configs/rtdetr/``."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rtdetr_helpers import one_thread  # noqa: F401 (a module fixture: one torch thread)

from visiontf.core.config_files import read_config
from visiontf.models import create_model
from visiontf.tasks.detection.detection_task import DetectionTask

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "rtdetr"
TINY = {"encoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32}, "decoder": {"hidden_dim": 32, "nhead": 2, "dim_feedforward": 32,
        "num_queries": 20, "num_layers": 2}, "denoising": {"num_denoising": 4}}
#: (epochs, backbone lr, warm-up steps, AMP) of each recipe: the originals' configs
RECIPES = {
    "rtdetrv2_r18vd_120e_coco": (120, 1e-4, 2000, True), "rtdetrv2_r34vd_120e_coco": (120, 5e-5, 2000, True),
    "rtdetrv2_r50vd_m_7x_coco": (84, 1e-5, 2000, True), "rtdetrv2_r50vd_6x_coco": (72, 1e-5, 2000, True),
    "rtdetrv2_r101vd_6x_coco": (72, 1e-6, 2000, True), "rtdetr_r18vd_6x_coco": (72, 1e-5, 0, False),
    "rtdetr_r34vd_6x_coco": (72, 1e-5, 0, False), "rtdetr_r50vd_6x_coco": (72, 1e-5, 0, False), "rtdetr_r101vd_6x_coco": (72, 1e-6, 0, False),
}


def _batch():
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 96, 128, generator=g)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, :, 96:] = True
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])}]
    return images, mask, targets


def test_task_trains_rtdetr_with_its_own_loss_and_groups():
    task = DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=TINY, lr=1e-3, lr_backbone=2e-4)
    assert task.criterion.class_loss == "vfl" and task.criterion.weight_dict["loss_ce"] == 1.0
    groups = task.configure_optimizers()["optimizer"].param_groups
    assert [g["lr"] for g in groups] == [1e-3, 2e-4]  # default, backbone: no separate lr for the sampling offsets
    task.train()
    loss = task.training_step(_batch(), 0)
    assert torch.isfinite(loss)
    loss.backward()
    # every parameter gets a gradient (DDP runs without find_unused_parameters), the frozen ones none
    missing = [n for n, p in task.model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing


def test_discrete_sampling_freezes_the_offsets_and_trains():
    model = create_model("rtdetrv2_r18vd_dsp", num_classes=3, backbone={"kwargs": {"widths": (8, 16, 32, 64), "stem_width": 4, "blocks": (1, 1, 1, 1)}},
                         **TINY)
    offsets = [p for n, p in model.named_parameters() if "sampling_offsets" in n]
    assert offsets and not any(p.requires_grad for p in offsets)
    images, mask, targets = _batch()
    out = model.train()(images, mask, targets=targets)
    assert out["pred_logits"].shape == (2, 20, 3) and "dn_outputs" in out and "interm_outputs" in out


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_coco_recipes_follow_the_originals(name):
    epochs, lr_backbone, warmup, amp = RECIPES[name]
    cfg = read_config(CONFIGS / f"{name}.yaml")
    trainer, args, data = cfg["trainer"], cfg["model"]["init_args"], cfg["data"]["init_args"]
    assert trainer["max_epochs"] == epochs and trainer["gradient_clip_val"] == 0.1 and trainer["sync_batchnorm"]
    assert trainer["precision"] == ("16-mixed" if amp else "32-true")
    assert trainer["devices"] * data["batch_size"] == 16  # the originals' total batch
    assert (args["lr"], args["lr_backbone"], args["weight_decay"], args["schedule"], args["warmup_steps"]) == (1e-4, lr_backbone, 1e-4, "constant", warmup)
    ema = next(c for c in trainer["callbacks"] if c["class_path"].endswith("ModelEMA"))["init_args"]
    assert ema == {"decay": 0.9999, "warmup_steps": 2000}
    assert args["model_name"] in name and data["scale_per_batch"]
    with torch.device("meta"):
        create_model(args["model_name"], **{k: v for k, v in args["model_kwargs"].items() if k != "backbone"})


def test_task_trains_with_hybrid_matching_from_its_sections():
    # the model section's one-to-many queries and the set_loss section's k and lambda reach the model and the criterion
    model_kwargs = {**TINY, "decoder": {**TINY["decoder"], "num_one_to_many_queries": 30}}
    task = DetectionTask("rtdetr_tiny", num_classes=3, model_kwargs=model_kwargs,
                         set_loss={"criterion": {"one_to_many_repeats": 2, "one_to_many_weight": 0.5}})
    assert (task.criterion.one_to_many_repeats, task.criterion.one_to_many_weight) == (2, 0.5)
    assert task.hparams["set_loss"]["criterion"]["one_to_many_repeats"] == 2  # plain data in the checkpoint
    task.train()
    images, mask, targets = _batch()
    outputs = task.model(images, mask, targets=targets)
    terms = task.criterion(outputs, targets)
    assert {"loss_ce_o2m", "loss_bbox_o2m", "loss_giou_o2m", "loss_giou_o2m_0"} <= set(terms)
    loss = task.training_step(_batch(), 0)
    assert torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in task.model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing


def test_tiny_shapes_config_builds_its_task():
    cfg = read_config(CONFIGS / "rtdetr_tiny_shapes.yaml")
    args = cfg["model"]["init_args"]
    task = DetectionTask(args["model_name"], num_classes=3, model_kwargs=args["model_kwargs"], set_loss=args["set_loss"],
                         lr=args["lr"], lr_backbone=args["lr_backbone"])
    assert task.model.decoder.options.num_queries == 50 and task.model.denoising.num_denoising == 50
    # the config's matcher: class cost 4, the rest RT-DETR's (L1 5, GIoU 2, focal)
    matcher = task.criterion.matcher
    assert (matcher.cost_class, matcher.cost_bbox, matcher.cost_giou) == (4.0, 5.0, 2.0)


def _small(**extra):
    return create_model("rtdetrv2_r18vd", num_classes=3, backbone={"kwargs": {"widths": (8, 16, 32, 64), "stem_width": 4, "blocks": (1, 1, 1, 1)}},
                        **TINY, **extra)


def test_fused_repvgg_blocks_give_the_same_outputs():
    model = _small().eval()
    for m in model.modules():  # BatchNorm statistics away from identity, so the fold has something to fold
        if isinstance(m, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(m.running_var, 0.5, 1.5)
            torch.nn.init.normal_(m.running_mean, std=0.1)
    images, mask, _ = _batch()
    with torch.no_grad():
        before = model(images, mask)
        assert model.fuse_repvgg() == 12
        after = model(images, mask)
    assert (before["pred_logits"] - after["pred_logits"]).abs().max() < 1e-4
    assert (before["pred_boxes"] - after["pred_boxes"]).abs().max() < 1e-5


def test_sampling_points_for_the_attention_picture():
    model = _small().eval()
    images, mask, _ = _batch()
    with torch.no_grad():
        out = model(images, mask, need_weights=True)
    assert out["dec_sampling_locations"].shape == (2, 20, 2, 3, 4, 2) and out["dec_attention_weights"].shape == (2, 20, 2, 3, 4)
    assert torch.allclose(out["dec_attention_weights"].sum((-1, -2)), torch.ones(2, 20, 2))
    assert out["dec_reference_points"].shape == (2, 20, 4) and len(out["spatial_shapes"]) == 3


def test_finetuning_to_other_classes_keeps_all_but_the_class_tensors(tmp_path, caplog):
    source = _small()
    torch.save(source.state_dict(), tmp_path / "weights.pth")
    model = create_model("rtdetrv2_r18vd", pretrained=str(tmp_path / "weights.pth"), num_classes=7,
                         backbone={"kwargs": {"widths": (8, 16, 32, 64), "stem_width": 4, "blocks": (1, 1, 1, 1)}}, **TINY)
    own, theirs = model.state_dict(), source.state_dict()
    changed = {k for k in own if own[k].shape != theirs[k].shape or not torch.equal(own[k], theirs[k])}
    assert changed and all(k.startswith(model.head_prefixes) for k in changed)
    assert model.decoder.score_heads[0].out_features == 7 and model.decoder.denoising_class_embed.num_embeddings == 8


def test_resnet_vd_is_a_backbone_name_of_every_detector():
    from visiontf.models.backbones.build import build_backbone

    backbone = build_backbone("resnet50vd", num_levels=3, freeze_stem=True)
    assert backbone.channels == [512, 1024, 2048] and backbone.strides == [8, 16, 32]
    frozen = {n.split(".")[0] for n, p in backbone.body.named_parameters() if not p.requires_grad}
    assert frozen == {"conv1", "layer1"}  # the DETR papers' frozen stem and first stage


@pytest.mark.parametrize("name", ["rtdetr_tiny", "dfine_tiny"])
def test_every_parameter_gets_a_gradient_when_no_image_has_a_box(name):
    """Plain DDP waits forever for a parameter without a gradient: a process whose images all lost their boxes to the
    crop has no denoising query, and the denoising label embedding must still take part (a recipe run hung so)."""
    from visiontf.set_prediction.set_loss import build_criterion

    torch.manual_seed(0)
    model = create_model(name, num_classes=4).train()
    criterion = build_criterion(model, 4)
    empty = {"labels": torch.zeros(0, dtype=torch.long), "boxes": torch.zeros(0, 4)}
    one = {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}
    for targets in ([one, empty], [empty, empty]):
        model.zero_grad()
        out = model(torch.randn(2, 3, 96, 96), None, targets=targets)
        criterion(out, targets)["loss"].backward()
        assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []


def test_images_too_small_for_the_queries_are_a_user_error_naming_the_positions_and_the_fix():
    """D-FINE-N's 300 queries over strides 16 and 32 need about 250 px a side: smaller images are the user's to fix
    (a one-line error in the tools), with the positions counted and the two settings that fix it."""
    from visiontf.core.errors import UserError
    from visiontf.models.rtdetr.rtdetr_decoder import ImageTooSmallError

    model = create_model("dfine_n", num_classes=3).eval()
    with torch.no_grad(), pytest.raises(ImageTooSmallError, match=r"num_queries=300 of the encoder's 100 positions \(the "
                                                                 r"pixels of its feature maps, 8 x 10 \+ 4 x 5 for these "
                                                                 r"images\); give larger images \(training: "
                                                                 r"data\.init_args\.scales, val_size; tools/export\.py: "
                                                                 r"--image_size; a Predictor: its min_size\) or build with "
                                                                 r"fewer queries") as caught:
        model(torch.rand(1, 3, 128, 160))
    assert isinstance(caught.value, UserError) and isinstance(caught.value, ValueError)
    with torch.no_grad():  # at 256 x 288 it has 288 + 72 positions
        assert model(torch.rand(1, 3, 256, 288))["pred_logits"].shape == (1, 300, 3)


@pytest.mark.parametrize("name", ["rtdetr_tiny", "dfine_tiny"])
def test_a_training_image_too_small_is_named_before_the_backbone_runs(name):
    """In training, a 32-px image gave the coarsest map one value per channel and BatchNorm failed ("Expected more
    than 1 value per channel") before the decoder counted its positions: both are now said first, in the user's terms."""
    from visiontf.models.rtdetr.rtdetr_decoder import ImageTooSmallError

    one = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}]
    model = create_model(name, num_classes=3).train()
    with pytest.raises(ImageTooSmallError, match=r"num_queries=100 of the encoder's 21 positions"):
        model(torch.rand(1, 3, 32, 32), None, targets=one)
    few = create_model(name, num_classes=3, decoder={"num_queries": 10}).train()
    with pytest.raises(ImageTooSmallError, match=r"a training batch of one 32 x 32 image gives the 1 x 1 map of the "
                                                 r"coarsest level one value per channel.*batch_size 2 or more"):
        few(torch.rand(1, 3, 32, 32), None, targets=one)
    assert few(torch.rand(2, 3, 32, 32), None, targets=one * 2)["pred_logits"].shape[-1] == 3
    assert few.eval()(torch.rand(1, 3, 32, 32))["pred_boxes"].shape == (1, 10, 4)
