"""FSDP trains the VQGAN transformer: ``tools/train.py --trainer.strategy fsdp`` with 2 CPU processes (gloo) on
a toy model. The transformer is sharded over the ranks, the frozen first stage is not (kept whole and unchanged),
checkpoints hold the full model and resume exactly. The four fits run in one 2-process launch
(tests/ddp_utils.py launch_runs)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ddp_utils import launch_runs, subprocess_env
from PIL import Image

from visiontf.models import create_model

TOY = {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [], "n_embed": 16, "embed_dim": 4,
       "z_channels": 32, "resolution": 16}
GPT = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """4 training and 2 validation images (one per rank) and a first-stage checkpoint of TokenizerTask's layout."""
    root = tmp_path_factory.mktemp("fsdp")
    rng = np.random.default_rng(0)
    for split, names in (("train", "abcd"), ("val", "ef")):
        (root / split).mkdir()
        for n in names:
            Image.fromarray(rng.integers(0, 256, (24, 28, 3), dtype=np.uint8)).save(root / split / f"{n}.png")
    torch.manual_seed(0)
    tokenizer = create_model("vqgan_tiny", **TOY)
    torch.save({"hyper_parameters": {"model_name": "vqgan_tiny", "model_kwargs": TOY},
                "state_dict": {f"model.{k}": v for k, v in tokenizer.state_dict().items()}}, root / "tok.ckpt")
    return root


def _fit(data, out, probe, *extra) -> dict:
    """One 2-process FSDP fit as a case of :func:`ddp_utils.launch_runs` (tests/ on the path for the probe)."""
    kwargs = ", ".join(f"{k}: {v}" for k, v in GPT.items())
    argv = ["fit", "--config", "configs/vqgan/vqgan_transformer_tiny.yaml",
            "--trainer.strategy=fsdp", "--trainer.devices=2", "--trainer.accelerator=cpu", "--trainer.precision=32-true",
            f"--model.init_args.first_stage_ckpt={data / 'tok.ckpt'}", f"--model.init_args.model_kwargs={{{kwargs}}}",
            f"--data.init_args.root={data / 'train'}", f"--data.init_args.val_root={data / 'val'}",
            "--data.init_args.crop_size=8", "--data.init_args.val_size=8", "--data.init_args.repeat=2",
            "--data.init_args.batch_size=2", "--data.init_args.cache=false", "--trainer.check_val_every_n_epoch=1",
            "--trainer.num_sanity_val_steps=0", "--trainer.logger=false", f"--trainer.default_root_dir={out}",
            "--trainer.callbacks+=fsdp_probe.FSDPProbe", *extra]
    return {"tool": "train", "argv": argv, "processes": 2, "env": {"VISIONTF_FSDP_PROBE": str(probe)}}


def _state(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.slow
def test_fsdp_shards_the_transformer_keeps_the_first_stage_and_resumes_exactly(data, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    # block by block (wrap_modules) instead of one unit: the class path form of the strategy
    wrapped = ('--trainer.strategy={"class_path": "visiontf.tasks.fsdp.FSDPStrategy", '
               '"init_args": {"wrap_modules": ["visiontf.models.vqgan.gpt.Block"]}}')
    # the four fits in one launch: rank 1 is started once and runs them with rank 0 (an interpreter start
    # costs more than a fit here). The interrupted run keeps every epoch's checkpoint (save_top_k -1), so the
    # second epoch's state is still there after the resumed run has overwritten last.ckpt
    every_epoch = "--checkpoint.save_top_k=-1"
    launch_runs([_fit(data, full, tmp_path / "probe_full", "--trainer.max_epochs=3"),
                 _fit(data, part, tmp_path / "probe_part", "--trainer.max_epochs=2", every_epoch),
                 _fit(data, part, tmp_path / "probe_resume", "--trainer.max_epochs=3", "--ckpt_path=last", every_epoch),
                 _fit(data, tmp_path / "blocks", tmp_path / "probe_blocks", "--trainer.max_epochs=1", wrapped)],
                tmp_path / "runs.json", timeout=400, env=subprocess_env())
    after_two = _state(part / "checkpoints" / "epoch001-step000004.ckpt")  # the second epoch's
    assert after_two["global_step"] == 4

    reference = create_model("vqgan_transformer_tiny", first_stage_kwargs=TOY, **GPT)
    n_gpt = sum(p.numel() for p in reference.transformer.parameters())
    n_first = sum(p.numel() for p in reference.first_stage_model.parameters())
    ranks = [json.loads((tmp_path / "probe_full" / f"rank{r}.json").read_text()) for r in (0, 1)]
    for info in ranks:
        assert info["wrapped_in_fsdp"] and info["world_size"] == 2
        # each rank holds a shard of the transformer, the shards together are all of it
        assert 0 < info["transformer_local_numel"] < n_gpt
        # the first stage: left out of FSDP's shards (ignored), whole on every rank, frozen, not in the optimiser
        assert info["ignored_numel"] == info["first_stage_numel"] == n_first
        assert info["first_stage_trainable"] == 0
        assert info["optimizer_params"] == sum(1 for _ in reference.transformer.parameters())
    assert sum(info["transformer_local_numel"] for info in ranks) == n_gpt
    blockwise = json.loads((tmp_path / "probe_blocks" / "rank0.json").read_text())
    assert blockwise["fsdp_units"] == 2 and ranks[0]["fsdp_units"] == 1  # the root and the one GPT block

    tokenizer = _state(data / "tok.ckpt")["state_dict"]
    final = _state(full / "checkpoints" / "last.ckpt")
    resumed = _state(part / "checkpoints" / "last.ckpt")
    assert final["global_step"] == resumed["global_step"] == 6  # 3 epochs of 4 images x2 repeat / (2 ranks x 2)
    weights = final["state_dict"]
    # the checkpoint holds the whole model (gathered from the shards), the first stage exactly as loaded
    assert {k for k in weights if k.startswith("model.")} == {f"model.{k}" for k in reference.state_dict()}
    for k, v in tokenizer.items():
        assert torch.equal(weights[f"model.first_stage_model.{k[len('model.'):]}"], v), k
    # the transformer trained: its weights moved between epoch 2 and epoch 3
    moved = [k for k in weights if "transformer" in k and not torch.equal(weights[k], after_two["state_dict"][k])]
    assert len(moved) > 5
    # resume restored the weights and AdamW's moments: the resumed run ends where the uninterrupted one did
    for k, v in weights.items():
        assert torch.allclose(resumed["state_dict"][k], v, atol=1e-6, rtol=0), k
    # torch's FSDP on the CPU with Lightning's offload_to_cpu saved exp_avg_sq as exp_avg (an aliased buffer)
    assert not any(torch.equal(s["exp_avg"], s["exp_avg_sq"]) for s in after_two["optimizer_states"][0]["state"].values())
    assert any((s["exp_avg"] < 0).any() for s in after_two["optimizer_states"][0]["state"].values())
    moments = [s[m] for s in final["optimizer_states"][0]["state"].values() for m in ("exp_avg", "exp_avg_sq")]
    resumed_moments = [s[m] for s in resumed["optimizer_states"][0]["state"].values() for m in ("exp_avg", "exp_avg_sq")]
    assert len(moments) == len(resumed_moments) > 0
    assert all(torch.allclose(a, b, atol=1e-9, rtol=1e-5) for a, b in zip(moments, resumed_moments))

    # the gathered checkpoint samples as any single-process one does
    from visiontf.tasks.checkpoints import load_checkpoint_model

    model, _ = load_checkpoint_model(full / "checkpoints" / "last.ckpt")
    codes = model.eval().sample(2, (4, 4), generator=torch.Generator().manual_seed(0))
    assert codes.shape == (2, 4, 4) and int(codes.max()) < TOY["n_embed"]


def test_frozen_subtrees_are_the_largest_frozen_modules_and_wrap_modules_are_checked():
    from visiontf.tasks.fsdp import FSDPStrategy, frozen_subtrees

    net = create_model("vqgan_transformer_tiny", first_stage_kwargs=TOY, **GPT)
    holder = torch.nn.ModuleDict({"model": net})
    assert frozen_subtrees(holder) == [net.first_stage_model]
    net.transformer.ln_f.requires_grad_(False)
    assert frozen_subtrees(holder) == [net.first_stage_model, net.transformer.ln_f]
    strategy = FSDPStrategy(wrap_modules=["visiontf.models.vqgan.gpt.Block"])
    from visiontf.models.vqgan.gpt import Block

    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {Block}  # Lightning turns the set into a policy
    with pytest.raises(ValueError, match="not an importable class"):
        FSDPStrategy(wrap_modules=["visiontf.models.vqgan.gpt.NoSuchBlock"])
