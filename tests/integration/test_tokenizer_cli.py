"""The tokenizer recipe (configs/vqgan/vqgan_tiny.yaml) at toy size through tools/train.py and tools/predict.py:
a fit, an exact resume across disc_start (the discriminator joins after the resume as it would have
uninterrupted), predict writing PNGs of the inputs' names and sizes. About 60 s on 2 shared cores."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cli_runner import run_tools
from PIL import Image

pytestmark = pytest.mark.slow

CONFIG = "configs/vqgan/vqgan_tiny.yaml"
TOY = ("--model.init_args.model_kwargs={ch: 32, ch_mult: [1, 2], num_res_blocks: 1, attn_resolutions: [], "
       "n_embed: 16, embed_dim: 4, z_channels: 32, resolution: 16, "
       "quantizer_kwargs: {kmeans_init: true, restart_dead_codes: true, dead_code_threshold: 0.03}}")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for split, names in (("train", ["a", "b", "c", "d"]), ("val", ["e"])):
        (root / split).mkdir()
        for n in names:
            Image.fromarray(rng.integers(0, 256, (24, 28, 3), dtype=np.uint8)).save(root / split / f"{n}.png")
    return root


def _fit(root, out, *extra):
    return {"argv": ["tools/train.py", "fit", "--config", CONFIG, f"--data.init_args.root={root}/train",
                     f"--data.init_args.val_root={root}/val", "--data.init_args.crop_size=16",
                     "--data.init_args.val_size=16", "--data.init_args.batch_size=2", "--data.init_args.repeat=1",
                     "--data.init_args.cache=false", TOY, "--model.init_args.disc_ndf=8", "--model.init_args.disc_layers=2",
                     "--model.init_args.disc_start=3", "--trainer.precision=32-true", "--trainer.max_epochs=2",
                     "--trainer.check_val_every_n_epoch=1", "--trainer.num_sanity_val_steps=0",
                     # the recipe's BudgetCosine anneals over each run's own budget: a run cut at 1 epoch and
                     # resumed would follow another schedule than the 2-epoch run; the exact resume is checked without it
                     "--trainer.callbacks=[]", f"--trainer.default_root_dir={out}", *extra]}


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_fit_resume_across_disc_start_predict_and_refusals(photos, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    odd = tmp_path / "odd"
    odd.mkdir()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (21, 30, 3), dtype=np.uint8)).save(odd / "x y.png")
    Image.fromarray(np.zeros((17, 17, 3), np.uint8)).save(odd / "flat.jpg")
    results = run_tools([
        _fit(photos, full),
        _fit(photos, part, "--trainer.max_epochs=1"),
        _fit(photos, part, "--ckpt_path=last"),
        {"argv": ["tools/predict.py", "--ckpt_path", full / "checkpoints" / "last.ckpt", "--input", odd,
                  "--output", tmp_path / "rec"]},
    ], tmp_path)
    for r in results[:4]:
        assert r["code"] == 0, r["stderr"][-3000:]
    a, b = _load(full / "checkpoints" / "last.ckpt"), _load(part / "checkpoints" / "last.ckpt")
    # 2 batches an epoch, disc_start 3: the discriminator joined in the resumed epoch's second batch
    assert int(a["state_dict"]["batches_done"]) == int(b["state_dict"]["batches_done"]) == 4
    assert any(k.startswith("discriminator.") for k in a["state_dict"])
    differ = [k for k, v in a["state_dict"].items() if not torch.equal(v, b["state_dict"][k])]
    assert not differ, f"weights differ after resume: {differ[:5]}"
    assert len(a["optimizer_states"]) == 2
    # the recipe's warm-up (4 of its 100 batches done) resumes where it stopped
    assert [sch["last_epoch"] for sch in a["lr_schedulers"]] == [sch["last_epoch"] for sch in b["lr_schedulers"]] == [4]
    for oa, ob in zip(a["optimizer_states"], b["optimizer_states"]):
        assert oa["state"].keys() == ob["state"].keys() and oa["state"]
        for k in oa["state"]:
            assert all(torch.equal(oa["state"][k][n], ob["state"][k][n]) for n in oa["state"][k])
    assert a["task"] == "generation" and "mean" in a["preprocess"]

    rec = tmp_path / "rec"
    assert sorted(p.name for p in rec.glob("*.png")) == ["flat.png", "x y.png"]
    assert Image.open(rec / "x y.png").size == (30, 21) and Image.open(rec / "flat.png").size == (17, 17)
    records = json.loads((rec / "predictions.json").read_text())
    assert {r["reconstruction"] for r in records} == {"flat.png", "x y.png"} and all("psnr" in r for r in records)
