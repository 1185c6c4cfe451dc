"""TokenizerTask: taming's loss pieces against hand computations, manual optimisation (which network each
step moves, the discriminator joining at disc_start), bf16 with clipping, the quantiser options, bad inputs.
The CLI fit and the exact resume across disc_start are in tests/integration/test_tokenizer_cli.py."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from visiontf.io.weights import WeightsError
from visiontf.models.vqgan.discriminator import NLayerDiscriminator
from visiontf.models.vqgan.quantize import VectorQuantizer2
from visiontf.tasks.generation.tokenizer_task import TokenizerTask
from visiontf.tasks.generation.vqgan_loss import LPIPSWeightsMissing, adaptive_weight, code_usage, hinge_d_loss, load_lpips

#: a VQGAN small enough for a test step (GroupNorm needs multiples of 32 channels)
TOY = {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [], "n_embed": 16, "embed_dim": 4,
       "z_channels": 32, "resolution": 16}


def _task(**kw) -> TokenizerTask:
    kw.setdefault("model_kwargs", TOY)
    return TokenizerTask("vqgan_tiny", perceptual_weight=0.0, disc_ndf=8, disc_layers=2, scale_lr=False, base_lr=1e-3,
                         **kw)


def _fit(task, steps: int, **trainer_kw) -> L.Trainer:
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.rand(8, 3, 16, 16) * 2 - 1), batch_size=2)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **trainer_kw)
    trainer.fit(task, data)
    return trainer


def test_adaptive_weight_is_tamings_gradient_ratio():
    w = torch.randn(3, 4, requires_grad=True)
    nll, g = (w**2).sum(), (w * 3.0).sum()
    expected = torch.norm(2 * w.detach()) / (torch.norm(torch.full_like(w, 3.0)) + 1e-4) * 0.8
    assert torch.allclose(adaptive_weight(nll, g, w, 0.8), expected)
    # clamped to [0, 1e4] before disc_weight
    g_flat = (w * 1e-9).sum()
    assert float(adaptive_weight((w**2).sum(), g_flat, w, 0.5)) == pytest.approx(0.5e4)


def test_hinge_and_code_usage():
    real, fake = torch.tensor([2.0, 0.5]), torch.tensor([-2.0, 0.0])
    assert float(hinge_d_loss(real, fake)) == pytest.approx(0.5 * (0.25 + 0.5))
    u = code_usage(torch.tensor([0, 0, 1, 3]), 8)
    assert float(u["used"]) == 3 / 8
    p = torch.tensor([0.5, 0.25, 0.25])
    assert float(u["perplexity"]) == pytest.approx(float(torch.exp(-(p * p.log()).sum())), rel=1e-5)


def test_discriminator_is_tamings_patchgan():
    d = NLayerDiscriminator()
    assert sum(p.numel() for p in d.parameters()) == 2765633  # taming: 2.77 M
    assert d(torch.zeros(1, 3, 256, 256)).shape == (1, 1, 30, 30)
    bn = [m for m in d.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(bn) == 3 and all(m.bias.abs().sum() == 0 for m in bn)


@pytest.mark.slow
def test_generator_and_discriminator_steps_move_their_own_network():
    task = _task(disc_start=2)
    d0 = {k: v.clone() for k, v in task.discriminator.state_dict().items()}
    m0 = {k: v.clone() for k, v in task.model.state_dict().items()}
    trainer = _fit(task, steps=2)  # two batches before disc_start: generator steps only
    assert int(task.batches_done) == 2 and trainer.global_step == 2
    assert all(torch.equal(v, task.discriminator.state_dict()[k]) for k, v in d0.items())
    assert not torch.equal(m0["decoder.conv_out.weight"], task.model.decoder.conv_out.weight)
    task2 = _task(disc_start=0)
    _fit(task2, steps=2)  # disc on: each batch steps both optimizers (Lightning counts 2 steps a batch)
    assert int(task2.batches_done) == 1
    assert not torch.equal(d0["main.0.weight"], task2.discriminator.main[0].weight)


def test_generator_loss_matches_a_hand_computation():
    """One generator step's loss is L1 + codebook + adaptive weight x g, as taming's formula on the same tensors."""
    task = _task(disc_start=0)
    task.train()
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    quant, qloss, _ = task.model.encode(x)
    rec = task.model.decode(quant)
    nll = (x - rec).abs().mean()
    g = -task.discriminator(rec).mean()
    last = task.model.decoder.conv_out.weight
    gn = torch.autograd.grad(nll, last, retain_graph=True)[0]
    gg = torch.autograd.grad(g, last, retain_graph=True)[0]
    expected = torch.clamp(gn.norm() / (gg.norm() + 1e-4), 0, 1e4) * 0.8
    assert torch.allclose(adaptive_weight(nll, g, task.model.last_layer(), 0.8), expected)


@pytest.mark.slow
def test_bf16_autocast_with_clipping():
    task = _task(disc_start=0, gradient_clip_val=1e-3)
    norms = []

    class Record(L.Callback):
        def on_train_start(self, trainer, pl_module):
            for opt in trainer.optimizers:
                opt.register_step_pre_hook(lambda o, *_: norms.append(torch.norm(torch.stack(
                    [p.grad.float().norm() for g in o.param_groups for p in g["params"] if p.grad is not None]))))

    _fit(task, steps=4, precision="bf16-mixed", callbacks=[Record()])
    assert len(norms) == 4 and all(float(n) <= 1e-3 * 1.01 for n in norms)
    assert all(torch.isfinite(p).all() for p in task.parameters())


def test_lr_is_scaled_like_tamings_main():
    task = TokenizerTask("vqgan_tiny", model_kwargs=TOY, perceptual_weight=0.0, base_lr=4.5e-6, accumulate=2)
    assert task.learning_rate() == pytest.approx(2 * 1 * 1 * 4.5e-6)  # no trainer: batch 1, 1 device


@pytest.mark.parametrize("options", [{}, {"kmeans_init": True}, {"restart_dead_codes": True, "dead_code_threshold": 2.0},
                                     {"l2_norm": True}, {"ema_decay": 0.5}])
def test_codebook_options(options):
    torch.manual_seed(0)
    q = VectorQuantizer2(8, 4, **options).train()
    before = q.embedding.weight.clone()
    z = torch.randn(2, 4, 4, 4) * 3
    z_q, loss, (ppl, _, idx) = q(z)
    if not options:
        assert set(q.state_dict()) == {"embedding.weight"}  # taming's keys
        return
    if options.get("kmeans_init"):
        assert float(q.initted) == 1 and not torch.equal(before, q.embedding.weight)
        flat = z.permute(0, 2, 3, 1).reshape(-1, 4)
        assert torch.cdist(q.embedding.weight, flat).min(dim=1).values.max() < 3  # centres among the data
    if options.get("restart_dead_codes"):  # threshold above the uniform share: every code is restarted
        flat = z.permute(0, 2, 3, 1).reshape(-1, 4)
        assert torch.cdist(q.embedding.weight, flat).min(dim=1).values.max() < 1e-2
    if options.get("l2_norm"):
        assert torch.allclose(z_q.norm(dim=1), torch.ones(()), atol=1e-5)
        assert torch.allclose(q.lookup(idx.view(2, 4, 4)).norm(dim=1), torch.ones(()), atol=1e-5)
    if options.get("ema_decay"):
        assert not q.embedding.weight.requires_grad and not torch.equal(before, q.embedding.weight)
        assert float(loss) == pytest.approx(0.25 * float(((z_q - z) ** 2).mean()), rel=1e-4)


def test_options_in_eval_change_nothing():
    q = VectorQuantizer2(8, 4, kmeans_init=True, restart_dead_codes=True, ema_decay=0.9).eval()
    before = {k: v.clone() for k, v in q.state_dict().items()}
    q(torch.randn(1, 4, 2, 2))
    assert all(torch.equal(v, q.state_dict()[k]) for k, v in before.items())


def test_nan_images_are_refused():
    task = _task()
    with pytest.raises(ValueError, match="NaN"):
        task.model(torch.full((1, 3, 16, 16), float("nan")))


def test_lpips_without_vgg_weights_fails_fast_with_the_fix(tmp_path):
    with pytest.raises(LPIPSWeightsMissing, match="perceptual_weight=0"):
        load_lpips(tmp_path / "absent.pth")


def test_a_damaged_vgg16_file_is_named_as_corrupt(tmp_path):
    """The VGG16 trunk is read through visiontf.io.weights.safe_torch_load: a cut-off file is named."""
    pytest.importorskip("lpips")
    torch.save({"features.0.weight": torch.zeros(64, 3, 3, 3)}, tmp_path / "vgg16.pth")
    data = (tmp_path / "vgg16.pth").read_bytes()
    (tmp_path / "vgg16.pth").write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match=r"vgg16.pth: corrupt or incomplete"):
        load_lpips(tmp_path / "vgg16.pth")


@pytest.mark.slow
def test_lpips_loads_a_vgg16_file(tmp_path):
    pytest.importorskip("lpips")
    import torchvision

    vgg = torchvision.models.vgg16()
    torch.save(vgg.state_dict(), tmp_path / "vgg16.pth")
    metric = load_lpips(tmp_path / "vgg16.pth")
    assert torch.equal(metric.net.slice1[0].weight, vgg.features[0].weight)
    assert torch.equal(getattr(metric.net.slice5, "28").weight, vgg.features[28].weight)
    x = torch.rand(1, 3, 32, 32) * 2 - 1
    assert float(metric(x, x).mean()) == pytest.approx(0.0, abs=1e-6)


def test_validation_logs_psnr_ssim_and_code_usage():
    # TokenizerTask builds its LightningModule without BaseTask's constructor: its evaluation state
    # (the weighted means of log_eval_mean) must exist all the same, or every validation crashes
    task = _task()
    data = DataLoader(TensorDataset(torch.rand(4, 3, 16, 16) * 2 - 1), batch_size=2)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.validate(task, data, verbose=False)[0]
    assert {"val/psnr", "val/ssim", "val/rec_loss", "val/codes_used", "val/perplexity"} <= set(metrics)
    assert 0.0 < metrics["val/codes_used"] <= 1.0 and metrics["val/psnr"] > 0.0


@pytest.mark.parametrize("rec_loss", ["l1", "l2"])
def test_rec_loss_is_the_chosen_pixel_term(rec_loss):
    """The generator's pixel term is taming's L1 or the mean squared error, on the batch it trains on."""
    import copy

    task = _task(rec_loss=rec_loss)
    before = copy.deepcopy(task.model).eval()
    trainer = _fit(task, 1)
    torch.manual_seed(0)
    x = (torch.rand(8, 3, 16, 16) * 2 - 1)[:2]  # _fit's first batch
    with torch.no_grad():
        diff = x - before(x)
    expected = diff.abs().mean() if rec_loss == "l1" else (diff ** 2).mean()
    assert torch.allclose(trainer.callback_metrics["train/rec_loss"], expected, atol=1e-6)


def test_unknown_rec_loss_is_refused():
    with pytest.raises(ValueError, match="rec_loss"):
        _task(rec_loss="l3")


def test_warmup_ramps_the_autoencoders_lr_only():
    """warmup_steps: the autoencoder's lr is base x (k + 1) / warmup after k steps; the discriminator's stays."""
    task = _task(warmup_steps=4)
    trainer = _fit(task, 2)
    opt_g, opt_d = trainer.optimizers
    assert opt_g.param_groups[0]["lr"] == pytest.approx(1e-3 * 3 / 4)
    assert opt_d.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert _fit(_task(), 2).optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-3)  # taming: no warm-up
