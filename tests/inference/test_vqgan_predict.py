"""The generation adapter: Predictor reconstructions at the original size (non-divisible sizes padded and
cropped back), PSNR records, second stages refused with the way to sample instead."""
from __future__ import annotations

import pytest
import torch

from visiontf.inference import Predictor
from visiontf.models import create_model
from visiontf.tasks.task_inference import get_adapter

TOY = {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [], "n_embed": 16, "embed_dim": 4,
       "z_channels": 32, "resolution": 16}


def test_predictor_reconstructs_at_the_original_size():
    torch.manual_seed(0)
    model = create_model("vqgan_tiny", **TOY)
    assert get_adapter(model).task == "generation"
    predictor = Predictor(model, device="cpu")
    images = [torch.rand(3, 13, 22), torch.rand(3, 16, 16)]
    results = predictor(images)
    assert [tuple(r["reconstruction"].shape) for r in results] == [(3, 13, 22), (3, 16, 16)]
    assert results[0]["reconstruction"].dtype == torch.uint8
    assert tuple(results[0]["codes"].shape) == (7, 11)  # 13x22 padded to 14x22, f2
    assert all(isinstance(r["psnr"], float) for r in results)
    # the same as the model's own pad-and-crop forward
    x = images[0] * 2 - 1
    expected = ((model(x[None])[0].clamp(-1, 1) + 1) / 2 * 255).round().to(torch.uint8)
    assert (expected.int() - results[0]["reconstruction"].int()).abs().max() <= 1


def test_second_stage_is_refused_with_the_way_to_sample():
    model = create_model("vqgan_transformer_tiny", first_stage_kwargs=TOY, block_size=16, n_layer=1, n_head=2, n_embd=32)
    predictor = Predictor(model, device="cpu")
    with pytest.raises(ValueError, match="tools/sample.py"):
        predictor([torch.rand(3, 16, 16)])


def test_transformer_task_refuses_a_missing_first_stage():
    from visiontf.tasks.generation.gpt_task import MissingFirstStageError, TransformerTask

    with pytest.raises(MissingFirstStageError, match="first_stage_ckpt"):
        TransformerTask(model_kwargs={"first_stage_kwargs": TOY, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32})


def test_transformer_task_groups_and_loss(tmp_path):
    """minGPT's groups (only Linear weights decay), AdamW betas (0.9, 0.95), the first stage frozen."""
    from visiontf.tasks.generation.gpt_task import TransformerTask

    net = create_model("vqgan_transformer_tiny", first_stage_kwargs=TOY, block_size=16, n_layer=1, n_head=2, n_embd=32)
    path = tmp_path / "net.pt"
    torch.save({"state_dict": net.state_dict()}, path)
    task = TransformerTask(model_kwargs={"first_stage_kwargs": TOY, "block_size": 16, "n_layer": 1, "n_head": 2,
                                         "n_embd": 32}, pretrained=str(path), scale_lr=False, base_lr=1e-3)
    opt = task.configure_optimizers()
    assert opt.defaults["betas"] == (0.9, 0.95)
    decayed, undecayed = opt.param_groups
    assert decayed["weight_decay"] == 0.01 and undecayed["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"])
    assert not any(p.requires_grad for p in task.model.first_stage_model.parameters())
    loss = task.training_step(torch.rand(2, 3, 8, 8) * 2 - 1, 0)  # 8 px -> 4x4 = 16 codes
    assert torch.isfinite(loss)



def test_transformer_task_validation_logs_bits_per_token(tmp_path):
    # TransformerTask builds its LightningModule without BaseTask's constructor: validation must still
    # find log_eval_mean's state (it crashed with AttributeError '_eval_means')
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from visiontf.tasks.generation.gpt_task import TransformerTask

    kwargs = {"first_stage_kwargs": TOY, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32}
    path = tmp_path / "net.pt"
    torch.save({"state_dict": create_model("vqgan_transformer_tiny", **kwargs).state_dict()}, path)
    task = TransformerTask(model_kwargs=kwargs, pretrained=str(path), scale_lr=False, base_lr=1e-3)
    data = DataLoader(TensorDataset(torch.rand(2, 3, 8, 8) * 2 - 1), batch_size=2)  # 8 px -> 16 codes
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.validate(task, data, verbose=False)[0]
    assert metrics["val/bits_per_token"] > 0.0 and "val/unigram_bits" in metrics

def test_weights_of_another_codebook_size_are_refused_by_name(tmp_path):
    from visiontf.models import WeightsLayoutError

    path = tmp_path / "tok.pt"
    torch.save(create_model("vqgan_tiny", **TOY).state_dict(), path)
    with pytest.raises(WeightsLayoutError, match="codebook of 16 codes"):
        create_model("vqgan_tiny", pretrained=str(path), **{**TOY, "n_embed": 32})


def test_a_transformer_checkpoint_does_not_open_the_first_stage_file_it_names(tmp_path, monkeypatch):
    """The checkpoint holds the first stage's weights and architecture; the tokenizer file its ``first_stage_ckpt``
    names is not opened while restoring (a checkpoint does not open files of its choosing)."""
    from visiontf.tasks.generation import gpt_task
    from visiontf.tasks.generation.gpt_task import TransformerTask

    net = create_model("vqgan_transformer_tiny", first_stage_kwargs=TOY, block_size=16, n_layer=1, n_head=2, n_embd=32)
    other = tmp_path / "private.bin"
    other.write_bytes(b"not the user's tokenizer")
    kwargs = {"first_stage_kwargs": TOY, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32}
    torch.save({"state_dict": {f"model.{k}": v for k, v in net.state_dict().items()},
                "pytorch-lightning_version": "2.6.0",
                "hyper_parameters": {"model_name": "vqgan_transformer_tiny", "first_stage_ckpt": str(other),
                                     "model_kwargs": kwargs}}, tmp_path / "gpt.ckpt")
    opened = []
    monkeypatch.setattr(gpt_task, "_first_stage", lambda path: opened.append(path))
    task = TransformerTask.load_from_checkpoint(tmp_path / "gpt.ckpt")
    assert opened == []
    for k, v in net.state_dict().items():
        assert torch.equal(task.model.state_dict()[k], v), k
