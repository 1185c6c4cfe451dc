"""Class-conditional VQGAN transformers (taming's class_label conditioning): labelled image folders (class = the
image's folder), the data's class count made the transformer's n_classes, the label as the first token in
training, and tools/sample.py drawing given classes; mismatches refused with the fix."""
from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

from visiontf.core.errors import UserError
from visiontf.data.loading import DatasetLayoutError
from visiontf.models import create_model
from visiontf.tasks.classification.classification_data import find_classes
from visiontf.tasks.generation.gpt_task import TransformerTask
from visiontf.tasks.generation.image_folder_data import TokenizerDataModule

TOY = {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [], "n_embed": 16, "embed_dim": 4,
       "z_channels": 32, "resolution": 16}
GPT = {"first_stage_kwargs": TOY, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32}


def _folder(root, classes=("cats", "dogs"), n=3):
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c / "sub").mkdir(parents=True)
        for i in range(n):  # any depth below the class folder
            Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(root / c / "sub" / f"{i}.png")
    return root


@pytest.fixture
def first_stage(tmp_path):
    path = tmp_path / "net.pt"
    torch.save({"state_dict": create_model("vqgan_transformer_tiny", **GPT).state_dict()}, path)
    return str(path)


def test_labelled_folders_give_classes_and_labels(tmp_path):
    root = _folder(tmp_path / "train")
    dm = TokenizerDataModule(str(root), val_root=str(_folder(tmp_path / "val", ("dogs",), 1)), crop_size=8,
                             val_size=8, batch_size=2, num_workers=0, labels=True)
    assert dm.num_classes == 2 and dm.class_names == ["cats", "dogs"]  # known before setup, for the CLI's link
    dm.setup("fit")
    seen = {int(dm.train_dataset[i][1]): dm.train_dataset.files[i].parts[-3] for i in range(6)}
    assert seen == {0: "cats", 1: "dogs"}
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (1, 3, 8, 8) and y.tolist() == [1]
    assert TokenizerDataModule(str(root), num_workers=0).num_classes is None  # unlabelled by default
    (root / "empty").mkdir()  # the classification layout's rule: a folder without images is no class
    assert TokenizerDataModule(str(root), num_workers=0, labels=True).class_names == find_classes(root) == ["cats", "dogs"]


def test_bad_labelled_layouts_are_refused_naming_the_file(tmp_path):
    root = _folder(tmp_path / "train")
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(root / "loose.png")
    with pytest.raises(DatasetLayoutError, match="loose.png.*class folder"):
        TokenizerDataModule(str(root), num_workers=0, labels=True)
    (root / "loose.png").unlink()
    dm = TokenizerDataModule(str(root), val_root=str(_folder(tmp_path / "val", ("birds",), 1)), crop_size=8,
                             num_workers=0, labels=True)
    with pytest.raises(DatasetLayoutError, match="'birds' is not one of the 2 training classes"):
        dm.setup("fit")


def test_the_label_is_the_first_token_and_mismatches_are_refused(first_stage):
    task = TransformerTask(num_classes=2, model_kwargs=GPT, pretrained=first_stage, scale_lr=False, base_lr=1e-3)
    assert task.model.n_classes == 2 and task.hparams["model_kwargs"]["n_classes"] == 2
    x = torch.rand(2, 3, 8, 8) * 2 - 1
    task.eval()
    with torch.no_grad():
        as_cats, _ = task.model(x, labels=torch.tensor([0, 0]))
        as_dogs, _ = task.model(x, labels=torch.tensor([1, 1]))
    assert not torch.allclose(as_cats, as_dogs)  # the label conditions every prediction
    task.train()
    assert torch.isfinite(task.training_step((x, torch.tensor([0, 1])), 0))
    with pytest.raises(UserError, match="labels true"):
        task.training_step((x,), 0)
    plain = TransformerTask(model_kwargs=GPT, pretrained=first_stage)
    with pytest.raises(UserError, match="unconditional"):
        plain.training_step((x, torch.tensor([0, 1])), 0)
    with pytest.raises(UserError, match="n_classes 3 but the data has 2"):
        TransformerTask(num_classes=2, model_kwargs={**GPT, "n_classes": 3}, pretrained=first_stage)


def test_fit_then_sample_given_classes(tmp_path, first_stage):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
    import sample

    dm = TokenizerDataModule(str(_folder(tmp_path / "train")), crop_size=8, batch_size=2, num_workers=0, labels=True)
    task = TransformerTask(num_classes=dm.num_classes, model_kwargs=GPT, pretrained=first_stage, scale_lr=False,
                           base_lr=1e-3)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(task, dm)
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    assert sample.main(["--ckpt_path", str(ckpt), "--output", str(tmp_path / "grid.png"), "--num", "4",
                        "--latent", "4", "4", "--label", "1"]) == 0
    assert Image.open(tmp_path / "grid.png").size[0] > 16
    with pytest.raises(UserError, match="classes 0..1"):
        sample.main(["--ckpt_path", str(ckpt), "--output", str(tmp_path / "g.png"), "--num", "2", "--label", "2"])
