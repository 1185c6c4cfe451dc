"""RestorationTask: losses, multi-task steps, fine-tuning from multi-task weights, the schedule, the DDP-summed
scores, checkpoints without a class count, and an exact resume of the CPU recipe (configs/ipt/ipt_tiny_sr_x2.yaml)."""
from __future__ import annotations

from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pytest
import torch
from ipt_helpers import RECIPE, toy_overrides

from visiontf.models import create_model
from visiontf.models.ipt.task_names import PRETRAIN_TASKS
from visiontf.tasks.checkpoints import CheckpointError, check_checkpoint_fits
from visiontf.tasks.restoration.restoration_measures import calc_psnr
from visiontf.tasks.restoration.restoration_metric import RestorationScores
from visiontf.tasks.restoration.restoration_task import RestorationTask, bicubic_upscale, patch_contrastive_loss


def test_bicubic_upscale_is_matlabs_imresize():
    lq = torch.rand(1, 3, 6, 5, dtype=torch.float64)
    up = bicubic_upscale(lq, 2)
    assert up.shape == (1, 3, 12, 10)
    # enlarging by 2: output 2 (1-based) samples u = 1.25 with cubic weights of distances 1.25, 0.25, 0.75, 1.75
    w = np.array([-0.0703125, 0.8671875, 0.2265625, -0.0234375])  # input rows 0 (mirrored), 1, 2, 3 (1-based)
    rows = lq[0, 0, [0, 0, 1, 2], 0].numpy()
    up_col = bicubic_upscale(lq[..., :1].contiguous(), 2)  # one column: the width direction is constant
    assert float(up_col[0, 0, 1, 0]) == pytest.approx(float(w @ rows), abs=1e-12)

SMALL = {"n_feats": 4, "patch_dim": 4, "num_heads": 2, "num_layers": 1, "tile_size": 16}


def test_input_skip_starts_as_bicubic_and_keeps_the_state_dict():
    torch.manual_seed(0)
    plain, skip = create_model("ipt_tiny", **SMALL), create_model("ipt_tiny", **SMALL, input_skip="bicubic")
    assert plain.state_dict().keys() == skip.state_dict().keys()
    x = torch.rand(2, 3, 16, 16)
    expected = torch.nn.functional.interpolate(x, scale_factor=2, mode="bicubic", align_corners=False)
    assert torch.allclose(skip(x), expected, atol=1e-6)
    with pytest.raises(ValueError, match="input_skip"):
        create_model("ipt_tiny", input_skip="nearest")


@pytest.mark.slow  # ~3 s alone, up to 20 s on the loaded 2-core machine
def test_multitask_steps_pick_the_batch_task_and_learn():
    torch.manual_seed(0)
    task = RestorationTask("ipt_tiny", model_kwargs={**SMALL, "tasks": ["sr_x2", "denoise_sigma30"]}, lr=1e-3,
                           contrastive_weight=0.1)
    opt = torch.optim.Adam(task.parameters(), lr=3e-3)
    hr = torch.rand(2, 3, 32, 32)
    sr_batch = (torch.nn.functional.avg_pool2d(hr, 2), hr, torch.tensor([0, 0]))
    dn_batch = ((hr[..., :16, :16] + 0.1 * torch.randn(2, 3, 16, 16)).clamp(0, 1), hr[..., :16, :16], torch.tensor([1, 1]))
    losses = []
    for step in range(8):
        batch = sr_batch if step % 2 == 0 else dn_batch
        loss = task.training_step(batch, step)
        assert loss.ndim == 0 and torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert task.model.head[1][0].weight.grad is not None  # the denoising head trained on its batches
    assert losses[-2] < losses[0] and losses[-1] < losses[1]


def test_contrastive_loss_rewards_patches_of_one_image_alike():
    torch.manual_seed(0)
    alike = torch.randn(4, 2, 4, 4).repeat(1, 1, 2, 2)  # every 4x4 patch of an image is the same vector
    random = torch.randn(4, 2, 8, 8)
    low, high = patch_contrastive_loss(alike, 4), patch_contrastive_loss(random, 4)
    assert float(low) < float(high)
    assert float(patch_contrastive_loss(random[:1], 4)) == 0.0  # one image: no negatives, no loss


def test_fine_tune_one_task_from_multitask_weights(tmp_path):
    multi = create_model("ipt_tiny", tasks=PRETRAIN_TASKS)
    path = tmp_path / "pretrain.pth"
    torch.save(multi.state_dict(), path)
    task = RestorationTask("ipt_tiny", model_kwargs={"tasks": ["sr_x3"]}, pretrained=str(path))
    assert task.model.tasks == ("sr_x3",) and task.scales == (3,)
    assert torch.equal(task.model.head[0][0].weight, multi.head[1][0].weight)  # sr_x3 is the second pre-training task
    assert torch.equal(task.model.body.query_embed.weight[0], multi.body.query_embed.weight[1])


def test_step_schedule_halves_the_learning_rate():
    task = RestorationTask("ipt_tiny", model_kwargs=SMALL, lr=1e-4, schedule="step", lr_step=3, gamma=0.5)
    sched = task.configure_optimizers()["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(7):
        lrs.append(sched.get_last_lr()[0])
        sched.optimizer.step()
        sched.step()
    np.testing.assert_allclose(lrs, [1e-4] * 3 + [5e-5] * 3 + [2.5e-5])
    with pytest.raises(ValueError, match="schedule"):
        RestorationTask("ipt_tiny", model_kwargs=SMALL, schedule="poly")


def test_scores_are_summed_states_per_task():
    metric = RestorationScores(2)
    assert all(metric._reductions[k].__name__.endswith("sum") for k in ("psnr_sum", "ssim_sum", "count"))
    torch.manual_seed(0)
    hr = torch.rand(3, 3, 24, 24)
    sr = (hr + 0.02 * torch.randn_like(hr)).clamp(0, 1)
    metric.update(sr[:1], hr[:1], 0, 2)
    metric.update(sr[1:], hr[1:], 0, 2)
    out = metric.compute()
    assert out["psnr"][0] == pytest.approx(float(calc_psnr(sr, hr, 2).mean()), abs=1e-9)
    assert out["count"].tolist() == [3, 0] and torch.isnan(out["psnr"][1])


def test_checkpoints_without_a_class_count():
    task = RestorationTask("ipt_tiny", model_kwargs=SMALL)
    assert task.hparams.num_classes is None
    ckpt = {"hyper_parameters": {"model_name": "ipt_tiny", "num_classes": None}, "task": "restoration"}
    check_checkpoint_fits(ckpt, "x.ckpt", task="restoration", model_name="ipt_tiny", num_classes=None)
    with pytest.raises(CheckpointError, match="segmentation"):
        check_checkpoint_fits(ckpt, "x.ckpt", task="segmentation", model_name="ipt_tiny", num_classes=3)


# ---------------------------------------------------------------------------------------- the recipe
@pytest.fixture(scope="module")
def photo_set(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:100, 0:104]
    for split, n in (("train", 3), ("val", 1)):
        (root / split).mkdir()
        for i in range(n):
            img = np.stack([128 + 80 * np.sin(x / (4.0 + i) + c) * np.cos(y / 6.0) for c in range(3)], axis=2)
            cv2.imwrite(str(root / split / f"p{i}.png"), np.clip(img + rng.normal(0, 5, img.shape), 0, 255).astype(np.uint8))
    return root


class StopAfterFirstEpoch(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        trainer.should_stop = True


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.slow
def test_recipe_resumes_exactly(photo_set, tmp_path):
    """Stopped after epoch 0 and resumed from last.ckpt: weights, EMA and Adam moments as an uninterrupted run."""
    from visiontf.cli.train import make_cli

    def fit(out: Path, *extra: str):
        L.seed_everything(0)
        make_cli(["fit", "--config", RECIPE, *toy_overrides(photo_set, out), "--trainer.max_epochs=2",
                  "--checkpoint.monitor=null", "--trainer.logger=false", *extra])

    fit(tmp_path / "full")
    fit(tmp_path / "part", "--trainer.callbacks+=test_restoration_task.StopAfterFirstEpoch")
    assert _load(tmp_path / "part" / "checkpoints" / "last.ckpt")["global_step"] == 3
    fit(tmp_path / "part", "--ckpt_path=last")
    full, resumed = _load(tmp_path / "full" / "checkpoints" / "last.ckpt"), _load(tmp_path / "part" / "checkpoints" / "last.ckpt")
    assert full["global_step"] == resumed["global_step"] == 6
    for key in ("state_dict", "current_model_state"):  # the EMA and the raw weights
        differ = [k for k, v in full[key].items() if not torch.equal(v, resumed[key][k])]
        assert not differ, f"{key} differs after resume: {differ[:5]}"
    for a, b in zip(full["optimizer_states"][0]["state"].values(), resumed["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a), "Adam moments differ after resume"
    assert full["task"] == "restoration" and full["preprocess"]["tasks"] == ("sr_x2",)


@pytest.mark.slow
def test_recipe_trains_and_scores_under_ddp(photo_set, tmp_path):
    """Two DDP processes: the fit runs (one task per batch on both ranks), and PSNR/SSIM over 3 validation
    images split across the ranks (2 + 1, no repeats) equal the single-process scores."""
    from ddp_utils import ddp_args, evaluate_runs, run

    val = tmp_path / "val"
    val.mkdir()
    for i, name in enumerate(sorted((photo_set / "train").iterdir())):
        (val / f"v{i}.png").write_bytes(name.read_bytes())
    # a validation set of at least one image per rank (Lightning's unrepeated sampler refuses an empty rank)
    overrides = [*toy_overrides(photo_set, tmp_path / "run"), f"--data.init_args.val_root={val}"]
    run(["tools/train.py", "fit", "--config", RECIPE, *overrides, *ddp_args(), "--trainer.max_steps=2",
         "--trainer.logger=false"])
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert _load(ckpt)["global_step"] == 2
    data = [f"--data.init_args.root={photo_set}", f"--data.init_args.val_root={val}", "--data.init_args.val_crop=64",
            "--data.init_args.num_workers=0", "--model.init_args.model_kwargs={scale: 2, n_feats: 4, num_layers: 1, num_heads: 2}"]
    stats = evaluate_runs(RECIPE, ckpt, tmp_path, data)
    one, two = stats["single"], stats["ddp"]
    for key in ("val/psnr_y", "val/ssim_y", "val/psnr_y_bicubic_sr_x2"):
        assert two[key] == pytest.approx(one[key], abs=1e-5), key
