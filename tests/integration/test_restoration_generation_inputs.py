"""Bad inputs of the restoration (IPT) and generation (VQGAN tokenizer + transformer) tasks, tried as a new user
would: odd images (1x1, 3x7, 16-bit, CMYK, truncated, empty) in prediction and in training folders, images the
tiles do not divide, weights of another scale or codebook, a transformer without its tokenizer, and
``tools/sample.py`` values out of range. Each is a right answer or one line naming the file, the field and
the fix (docs/robustness.md, "Restoration and generation").
"""
from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
import torch
from cli_runner import error_line, run_tools
from PIL import Image

from visiontf.core.errors import UserError
from visiontf.data.io import read_image
from visiontf.inference.predictor import Predictor
from visiontf.models import ModelArgumentError, WeightsLayoutError, create_model
from visiontf.tasks.restoration.restoration_files import read_rgb8

IPT = {"scale": 2, "n_feats": 4, "patch_dim": 4, "num_heads": 2, "num_layers": 1, "tile_size": 16}
TOY = {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [], "n_embed": 16, "embed_dim": 4,
       "z_channels": 32, "resolution": 16}
GPT = {"first_stage_kwargs": TOY, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32}


def _odd_images(folder):
    """name -> (path, (H, W) or None when unreadable)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (1, 1, 3), dtype=np.uint8)).save(folder / "one.png")
    Image.fromarray(rng.integers(0, 256, (7, 3, 3), dtype=np.uint8)).save(folder / "three_by_seven.png")
    cv2.imwrite(str(folder / "sixteen.png"), rng.integers(0, 65536, (20, 26, 3), dtype=np.uint16))
    Image.fromarray(rng.integers(0, 256, (20, 26, 4), dtype=np.uint8), mode="CMYK").save(folder / "cmyk.jpg")
    Image.fromarray(rng.integers(0, 256, (25, 38, 3), dtype=np.uint8)).save(folder / "odd_tiles.png")
    Image.fromarray(rng.integers(0, 256, (20, 26, 3), dtype=np.uint8)).save(folder / "whole.jpg")
    data = (folder / "whole.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (folder / "whole.jpg").unlink()
    (folder / "empty.png").write_bytes(b"")
    sizes = {"one": (1, 1), "three_by_seven": (7, 3), "sixteen": (20, 26), "cmyk": (20, 26), "odd_tiles": (25, 38),
             "truncated": None, "empty": None}
    return {name: (next(folder.glob(f"{name}.*")), size) for name, size in sizes.items()}


def test_every_reader_converts_16_bit_and_cmyk_images_alike(tmp_path):
    """Prediction (visiontf.data.io.read_image) and the restoration data (read_rgb8) used to read a 16-bit RGB
    PNG as its high bytes against a rounding, and a CMYK JPEG through two colour conversions (1 and 2 levels
    apart): a restored 16-bit photo was predicted from other pixels than it was scored on."""
    images = _odd_images(tmp_path)
    raw = cv2.imread(str(images["sixteen"][0]), cv2.IMREAD_UNCHANGED)[..., ::-1]
    rounded = np.floor(raw / 257 + 0.5).astype(np.uint8)
    for name in ("sixteen", "cmyk", "one", "three_by_seven"):
        path = images[name][0]
        assert np.array_equal(read_image(path), read_rgb8(path)), name
    assert np.array_equal(read_image(images["sixteen"][0]), rounded)
    assert np.array_equal(read_rgb8(images["cmyk"][0]), np.asarray(Image.open(images["cmyk"][0]).convert("RGB")))


def test_odd_images_are_restored_and_reconstructed_at_their_own_size(tmp_path, caplog):
    images = _odd_images(tmp_path / "in")
    paths = [p for p, _ in images.values()]
    torch.manual_seed(0)
    ipt = Predictor(create_model("ipt_tiny", **IPT), device="cpu")
    vqgan = Predictor(create_model("vqgan_tiny", **TOY), device="cpu")
    with caplog.at_level(logging.WARNING):
        restored, rebuilt = ipt(paths), vqgan(paths)
    for (name, (path, size)), r, g in zip(images.items(), restored, rebuilt):
        if size is None:  # unreadable: that input fails alone, named
            assert str(path) in r["error"] and str(path) in g["error"], (name, r, g)
            continue
        h, w = size
        assert tuple(r["image"].shape) == (3, 2 * h, 2 * w), name  # tiles of 16 px need not divide the image
        assert tuple(g["reconstruction"].shape) == (3, h, w), name  # a 1x1 image failed in a GroupNorm before
    # the 16-bit file is restored exactly as its 8-bit rounding would be
    as_8bit = tmp_path / "sixteen_as_8bit.png"
    Image.fromarray(read_rgb8(images["sixteen"][0])).save(as_8bit)
    assert torch.equal(ipt([as_8bit])[0]["image"], restored[2]["image"])
    assert "empty.png: file is empty (0 bytes)" in caplog.text and "truncated.jpg: corrupt or truncated image" in caplog.text


def test_training_folders_with_odd_images_skip_and_count_or_refuse_in_strict_mode(tmp_path, caplog):
    from visiontf.tasks.generation.image_folder_data import TokenizerDataModule
    from visiontf.tasks.restoration.restoration_data import RestorationDataModule

    images = _odd_images(tmp_path / "train")
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(tmp_path / "train" / "ok.png")
    val = tmp_path / "val"
    val.mkdir()
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(val / "v.png")
    with caplog.at_level(logging.INFO):
        dm = RestorationDataModule(tmp_path / "train", val_root=val, tasks=["sr_x2"], patch_size=8, num_workers=0)
        dm.setup("fit")
    kept = sorted(r.hr.name for r in dm.train_dataset.records)
    assert kept == ["cmyk.jpg", "odd_tiles.png", "ok.png", "sixteen.png"]  # 16 px minimum: 8-px patches at x2
    assert "skipped 2 unreadable image(s)" in caplog.text and "skipped 2 too small image(s)" in caplog.text
    assert "1 image(s) 16-bit rounded to 8 bits" in caplog.text and "1 image(s) CMYK converted to RGB" in caplog.text
    lq, hr, _ = dm.train_dataset[kept.index("sixteen.png")]
    assert lq.shape == (3, 8, 8) and hr.shape == (3, 16, 16)
    with pytest.raises(UserError, match=r"(empty|truncated|one|three_by_seven)\.(png|jpg)"):
        RestorationDataModule(tmp_path / "train", val_root=val, patch_size=8, num_workers=0, strict=True).setup("fit")
    # the tokenizer: an unreadable file is replaced by the next readable one and named; strict refuses it
    tok = TokenizerDataModule(str(tmp_path / "train"), val_root=str(val), crop_size=8, val_size=8, num_workers=0)
    tok.setup("fit")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        crops = [tok.train_dataset[i][0] for i in range(len(tok.train_dataset))]
    assert all(c.shape == (3, 8, 8) for c in crops)
    assert "empty.png" in caplog.text and "truncated.jpg" in caplog.text
    strict = TokenizerDataModule(str(tmp_path / "train"), crop_size=8, num_workers=0, on_bad_image="raise")
    strict.setup("fit")
    with pytest.raises(UserError, match="empty.png: file is empty"):
        [strict.train_dataset[i] for i in range(len(strict.train_dataset))]
    assert images["empty"][1] is None


def test_tiles_scales_and_codebooks_that_do_not_fit_are_refused_naming_the_fix(tmp_path):
    with pytest.raises(ModelArgumentError, match=r"ipt_tiny: tile_size must be a multiple of 4 .*got 50 .*model_kwargs"):
        create_model("ipt_tiny", **{**IPT, "tile_size": 50})
    with pytest.raises(ModelArgumentError, match=r"unexpected keyword argument 'tile'"):
        create_model("ipt_tiny", tile=48)
    x2 = tmp_path / "ipt_x2.pth"
    torch.save(create_model("ipt_tiny", **IPT).state_dict(), x2)
    with pytest.raises(WeightsLayoutError, match=rf"{x2}: .*restore x2 and ipt_tiny is built for x3; build it with scale=2"):
        create_model("ipt_tiny", pretrained=str(x2), **{**IPT, "scale": 3})
    with pytest.raises(UserError, match=r"restore_task 'sr_x3' .*this model restores sr_x2"):
        Predictor(create_model("ipt_tiny", **IPT), device="cpu", preprocess={"restore_task": "sr_x3"})
    with pytest.raises(UserError, match=r"restore_task '3' .*index 0\.\.0"):
        Predictor(create_model("ipt_tiny", **IPT), device="cpu", preprocess={"restore_task": "3"})
    tok = tmp_path / "tok16.pth"
    torch.save(create_model("vqgan_tiny", **TOY).state_dict(), tok)
    with pytest.raises(WeightsLayoutError, match=rf"{tok}: .*codebook of 16 codes x 4 .*model_kwargs: {{n_embed: 16, embed_dim: 4}}"):
        create_model("vqgan_tiny", pretrained=str(tok), **{**TOY, "n_embed": 32})


def _task_checkpoint(path, model_name: str, kwargs: dict) -> str:
    """A task checkpoint as visiontf writes it (weights under ``model.``, the task's hyper-parameters)."""
    net = create_model(model_name, **kwargs)
    torch.save({"state_dict": {f"model.{k}": v for k, v in net.state_dict().items()},
                "hyper_parameters": {"model_name": model_name, "model_kwargs": kwargs}}, path)
    return str(path)


def test_a_transformer_without_its_tokenizer_is_refused_at_build_or_start_naming_it(tmp_path):
    from visiontf.tasks.generation.gpt_task import MissingFirstStageError, TransformerTask

    gpt = {k: v for k, v in GPT.items() if k != "first_stage_kwargs"}
    missing = str(tmp_path / "gone" / "last.ckpt")
    with pytest.raises(MissingFirstStageError, match=r"first_stage_ckpt=.*gone/last.ckpt: no tokenizer checkpoint there "
                                                     r"\(the folder does not exist\); train the first stage first"):
        TransformerTask(model_kwargs=gpt, first_stage_ckpt=missing)
    ipt = _task_checkpoint(tmp_path / "ipt.ckpt", "ipt_tiny", IPT)
    with pytest.raises(MissingFirstStageError, match="a checkpoint of ipt_tiny, IPT, not a tokenizer"):
        TransformerTask(model_kwargs=gpt, first_stage_ckpt=ipt)
    tok = _task_checkpoint(tmp_path / "tok.ckpt", "vqgan_tiny", TOY)
    second = _task_checkpoint(tmp_path / "gpt.ckpt", "vqgan_transformer_tiny", GPT)
    with pytest.raises(MissingFirstStageError, match="a second stage \\(transformer\\), not a tokenizer"):
        TransformerTask(model_kwargs=gpt, first_stage_ckpt=second)
    with pytest.raises(MissingFirstStageError, match=r"its tokenizer \(16 codes\) does not fit .*n_embed: 32 \(the tokenizer's: 16\)"):
        TransformerTask(model_kwargs={**gpt, "first_stage_kwargs": {"n_embed": 32}}, first_stage_ckpt=tok)
    task = TransformerTask(model_kwargs=gpt, first_stage_ckpt=tok)
    assert task.hparams["model_kwargs"]["first_stage_kwargs"]["n_embed"] == 16
    # the tokenizer's file moved after training: the task's own hyper-parameters (with the tokenizer's
    # architecture) still build it, and the checkpoint being restored holds the first stage's weights
    resumed = TransformerTask(model_kwargs=task.hparams["model_kwargs"], first_stage_ckpt=missing)
    with pytest.raises(MissingFirstStageError, match="no tokenizer checkpoint there"):
        resumed.on_fit_start()  # nothing restored: it would train over an untrained first stage
    resumed.on_load_checkpoint({"hyper_parameters": dict(task.hparams), "state_dict": task.state_dict()})
    resumed.on_fit_start()
    resumed.on_validation_start()


@pytest.mark.slow  # one process: ~25 refused command lines after one import of torch and Lightning (~20 s)
def test_sample_values_out_of_range_and_restoration_mismatches_are_one_line_errors(tmp_path):
    from test_hostile_checkpoints import _clean_checkpoint

    gpt = _task_checkpoint(tmp_path / "gpt.ckpt", "vqgan_transformer_tiny", GPT)
    tok = _task_checkpoint(tmp_path / "tok.ckpt", "vqgan_tiny", TOY)
    ipt = tmp_path / "ipt.ckpt"
    torch.save(_clean_checkpoint(), ipt)
    photos = tmp_path / "photos"
    for split in ("train", "val"):
        (photos / split).mkdir(parents=True)
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(photos / split / "p.png")
    out = tmp_path / "s.png"
    refused = {
        "--num 0": (["--num", "0"], "--num 0: give the number of images to sample, >= 1"),
        "--latent 0 4": (["--latent", "0", "4"], "--latent 0 4: the code grid needs >= 1 row and column"),
        "--latent 8 8": (["--latent", "8", "8"], "--latent 8 8: 64 codes, but this transformer's block holds 16"),
        "--temperature 0": (["--temperature", "0"], "--temperature 0.0: give a finite value > 0"),
        "--temperature nan": (["--temperature", "nan"], "--temperature nan: give a finite value > 0"),
        "--top_k 0": (["--top_k", "0"], "--top_k 0: keeps the k most likely codes; give k >= 1"),
        "--top_k 17": (["--top_k", "17"], "--top_k 17: the codebook has 16 codes; give 1..16"),
        "--top_p 0": (["--top_p", "0"], "--top_p 0.0: a probability mass in (0, 1]"),
        "--top_p 1.5": (["--top_p", "1.5"], "--top_p 1.5: a probability mass in (0, 1]"),
        "--label 0": (["--label", "0"], "--label 0: " + gpt + " is an unconditional transformer; drop --label"),
        "--output folder": (["--output", str(tmp_path)], f"--output {tmp_path}: a folder; give the grid's file name"),
        "--output no suffix": (["--output", str(tmp_path / "grid")], "not an image file name; end it with .png"),
        "a tokenizer checkpoint": (["--ckpt_path", tok], f"{tok}: not a second-stage (transformer) checkpoint"),
    }
    cases = [{"argv": ["tools/sample.py", "--ckpt_path", gpt, "--output", out, *args]} for args, _ in refused.values()]
    ipt_data = [f"--data.init_args.root={photos}", "--data.init_args.num_workers=0", "--data.init_args.val_crop=32",
                f"--model.init_args.model_kwargs={ {'scale': 2, 'n_feats': 4, 'num_layers': 1, 'num_heads': 2} }",
                "--trainer.logger=false", "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path / 'run'}"]
    more = {
        "eval x2 on x3 data": (["tools/eval.py", "--config", "configs/ipt/ipt_tiny_sr_x2.yaml", "--ckpt_path", ipt, *ipt_data,
                                "--data.init_args.tasks=[sr_x3]"],
                               "data.init_args.tasks ['sr_x3'], but ipt_tiny restores ['sr_x2']"),
        "predict --restore_task sr_x3": (["tools/predict.py", "--ckpt_path", ipt, "--input", photos / "val", "--output",
                                          tmp_path / "o", "--restore_task", "sr_x3"],
                                         "restore_task 'sr_x3' (tools/predict.py --restore_task): this model restores sr_x2"),
        "fit tile_size 50": (["tools/train.py", "fit", "--config", "configs/ipt/ipt_tiny_sr_x2.yaml", *ipt_data[:3],
                              "--model.init_args.model_kwargs={scale: 2, n_feats: 4, num_layers: 1, num_heads: 2, tile_size: 50}",
                              *ipt_data[4:]],
                             "ipt_tiny: tile_size must be a multiple of 4 (tiles overlap by tile_size // 4), got 50"),
        "transformer without its tokenizer": (
            ["tools/train.py", "fit", "--config", "configs/vqgan/vqgan_transformer_tiny.yaml",
             f"--data.init_args.root={photos}/train", f"--data.init_args.val_root={photos}/val",
             f"--model.init_args.first_stage_ckpt={tmp_path / 'nope' / 'last.ckpt'}", "--trainer.logger=false",
             f"--trainer.default_root_dir={tmp_path / 'run2'}"],
            "no tokenizer checkpoint there (the folder does not exist); train the first stage first"),
    }
    cases += [{"argv": argv} for argv, _ in more.values()]
    results = run_tools(cases + [{"argv": ["tools/sample.py", "--ckpt_path", gpt, "--output", out, "--num", "2",
                                           "--latent", "2", "3", "--top_k", "16", "--top_p", "1"]}], tmp_path)
    for (what, (_, expected)), result in zip([*refused.items(), *more.items()], results):
        assert result["code"] == 2, (what, result["stderr"][-3000:])
        assert expected in error_line(result), (what, error_line(result))
    assert results[-1]["code"] == 0, results[-1]["stderr"][-3000:]
    assert Image.open(out).size[0] > 4
