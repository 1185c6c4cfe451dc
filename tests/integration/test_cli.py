"""The one CLI: configs parse, num_classes is linked from the data module."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
#: the shipped configs; the files under a _base/ folder are parts that variants build on (base_config:), not run alone
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml") if "_base" not in p.parts)
#: the configs that build on base files
COMPOSED = [c for c in CONFIGS if "base_config" in yaml.safe_load((ROOT / c).read_text())]


@pytest.fixture(scope="module")
def printed_configs(tmp_path_factory) -> dict[str, dict]:
    """``tools/train.py fit --config C --print_config`` for every shipped config, and for each composed one also
    of one file holding the plain merge of it and its bases (``flat:C``), in one process."""
    from cli_runner import run_tools

    from visiontf.core.config_files import read_config

    tmp = tmp_path_factory.mktemp("print_config")
    flat = {}
    for c in COMPOSED:
        flat[f"flat:{c}"] = tmp / c.replace("/", "__")
        flat[f"flat:{c}"].write_text(yaml.safe_dump(read_config(ROOT / c), sort_keys=False))
    runs = {**{c: c for c in CONFIGS}, **flat}
    results = run_tools([{"argv": ["tools/train.py", "fit", "--config", str(f), "--print_config"]} for f in runs.values()],
                        tmp)
    return dict(zip(runs, results))


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_parses(printed_configs, config):
    out = printed_configs[config]
    assert out["code"] == 0, out["stderr"][-2000:]
    cfg = yaml.safe_load(out["stdout"])
    from visiontf.tasks.task_table import data_module_class_paths, task_class_paths

    # the full class paths of the task table (a short name in the config resolves to one of them)
    assert cfg["model"]["class_path"] in task_class_paths()
    assert cfg["data"]["class_path"] in data_module_class_paths()


@pytest.mark.parametrize("config", COMPOSED)
def test_a_variant_resolves_to_the_merge_of_its_files(printed_configs, config):
    """``--config V`` (V names its bases under base_config:) parses to exactly what one file holding the merge of
    the bases and V parses to: every value, defaults included (docs/recipes.md, "A variant of a recipe")."""
    ours, flat = printed_configs[config], printed_configs[f"flat:{config}"]
    assert ours["code"] == 0 and flat["code"] == 0, (ours["stderr"] + flat["stderr"])[-2000:]
    assert yaml.safe_load(ours["stdout"]) == yaml.safe_load(flat["stdout"])
    assert "base_config" not in yaml.safe_load(ours["stdout"])  # the printed config stands alone


def test_the_recipe_variants_build_on_their_shared_schedules():
    """Each COCO variant of RT-DETR, D-FINE, DEIM, DETR and Deformable DETR and each SETR mmseg variant names its
    family's shared file and states what differs, not the whole of it (no seed, checkpoint, accelerator or class_path)."""
    import fnmatch

    patterns = ("configs/rtdetr/*_coco.yaml", "configs/dfine/*_coco.yaml", "configs/deim/*_coco.yaml",
                "configs/detr/detr_r*_coco.yaml", "configs/deformable_detr/deformable_detr_r50_*coco.yaml",
                "configs/setr/setr_*_ade20k.yaml", "configs/setr/setr_*_cityscapes.yaml")
    variants = [c for c in CONFIGS if any(fnmatch.fnmatch(c, p) for p in patterns)]
    assert len(variants) == 9 + 5 + 10 + 3 + 3 + 6 and set(variants) <= set(COMPOSED)
    for c in COMPOSED:
        cfg = yaml.safe_load((ROOT / c).read_text())
        restated = [k for k in ("seed_everything", "checkpoint") if k in cfg]
        restated += [f"{k}.class_path" for k in ("model", "data") if "class_path" in (cfg.get(k) or {})]
        assert not restated and "accelerator" not in cfg["trainer"], f"{c} restates its base's {restated}"


@pytest.mark.slow
def test_fit_links_num_classes_and_writes_last_checkpoint(tmp_path):
    from visiontf.tasks.classification.classification_synthetic import make_classification_dataset

    root = make_classification_dataset(tmp_path / "data", num_train=12, num_val=6, num_classes=3, image_size=32)
    cmd = [sys.executable, "tools/train.py", "fit", "--config", "configs/vit/vit_tiny_synthetic.yaml",
           f"--data.init_args.root={root}", "--data.init_args.image_size=32", "--data.init_args.num_workers=0",
           "--model.init_args.model_kwargs={img_size: 32, patch_size: 8, depth: 1}", "--trainer.max_epochs=1",
           f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.enable_progress_bar=false"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert list((tmp_path / "run" / "csv").rglob("metrics.csv"))
    import torch

    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert ckpt["hyper_parameters"]["num_classes"] == 3
    assert ckpt["state_dict"]["model.head.weight"].shape[0] == 3
