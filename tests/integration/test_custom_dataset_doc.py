"""docs/custom_dataset.md cannot rot: every command in its ```bash blocks runs here, in order, on a
hand-made COCO set with category ids 3, 7 and 12, in tiny versions (1 epoch, 4 training images at
64 px, a 1+1-layer DETR or DINO).

What the test changes in each command, and nothing else:
* paths: ``data/my_dataset``, ``outputs/``, ``my_detr.yaml`` and the R50 and DINO weight files point into tmp;
* train commands get :data:`TINY` (sizes, epochs, workers); the R50 recipe also runs ``detr_tiny`` on
  the CPU, from a 91-class weight file in DETR's checkpoint form, so its class head is replaced as
  the R50's would be; the DINO recipe runs ``dino_tiny`` from a 91-class file likewise (class heads
  and the denoising label book replaced);
* predict commands keep every detection (``--score_threshold 0``), so the category ids are checked
  on real output of an untrained model.
The commands run batched in one process (tests/cli_runner.py): about 40 s on two shared cores.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch
from cli_runner import run_tools
from handmade_data import CATEGORIES, make_dataset
from handmade_data import TINY_COCO_RUN as TINY

import visiontf

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "custom_dataset.md"
IDS = sorted(CATEGORIES)
R50_ON_CPU = ["--model.init_args.model_name=detr_tiny", "--trainer.accelerator=cpu", "--trainer.devices=1",
              "--trainer.strategy=auto", "--model.init_args.lr_backbone=1e-5"]
#: the DINO-4scale R50 recipe, run as dino_tiny (the same class-dependent tensors: class heads and label_enc)
DINO_ON_CPU = ["--model.init_args.model_name=dino_tiny", "--trainer.accelerator=cpu", "--trainer.devices=1",
               "--trainer.strategy=auto"]


def doc_commands() -> list[list[str]]:
    """The ``python tools/...`` commands of the doc's bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].strip()
            if line:
                assert line.startswith("python tools/"), f"a bash line the test cannot run: {line}"
                commands.append(shlex.split(line)[1:])
    return commands


def _tiny_version(argv: list[str], paths: dict[str, str]) -> dict:
    argv = [next((a.replace(k, v) for k, v in paths.items() if k in a), a) if not a.startswith("--") or "=" in a else a
            for a in argv]
    case: dict = {"argv": argv}
    if ">" in argv:
        i = argv.index(">")
        case["stdout_to"], argv = argv[i + 1], argv[:i]
    tool, sub = Path(argv[0]).name, argv[1] if len(argv) > 1 else ""
    if tool == "train.py" and sub == "fit":
        extra = TINY + (R50_ON_CPU if "detr_r50_finetune_custom" in " ".join(argv) else [])
        extra += DINO_ON_CPU if "dino_r50_finetune_custom" in " ".join(argv) else []
        if "--print_config" in argv:
            i = argv.index("--print_config")
            argv = argv[:i] + extra + argv[i:]
        elif not any(a.endswith("my_detr.yaml") for a in argv):  # commands on my_detr.yaml inherit TINY from it
            argv = argv + extra
    if tool == "predict.py":
        argv = argv + ["--score_threshold", "0.0", "--top_k", "3", "--device", "cpu"]
    case["argv"] = argv
    return case


@pytest.mark.slow
def test_every_command_of_the_custom_dataset_doc(tmp_path):
    data = make_dataset(tmp_path / "data" / "my_dataset", "coco")
    r50 = tmp_path / "detr-r50-e632da11.pth"  # DETR's checkpoint form ({"model": state}) with COCO's 91 classes
    kwargs = {"backbone": {"frozen_bn": False, "freeze_stem": False}, "arch": {"num_queries": 10, "enc_layers": 1, "dec_layers": 1}}
    torch.save({"model": visiontf.create_model("detr_tiny", num_classes=91, **kwargs).state_dict()}, r50)
    dino = tmp_path / "checkpoint0011_4scale.pth"  # COCO's 91 classes, in visiontf's names
    torch.save({"model": visiontf.create_model("dino_tiny", num_classes=91, **kwargs).state_dict()}, dino)
    out = tmp_path / "outputs"
    paths = {"data/my_dataset": str(data), "outputs/": f"{out}/", "my_detr.yaml": str(tmp_path / "my_detr.yaml"),
             "checkpoints/detr-r50-e632da11.pth": str(r50), "checkpoints/checkpoint0011_4scale.pth": str(dino)}
    commands = doc_commands()
    assert len(commands) == 11, commands
    cases = [_tiny_version(c, paths) for c in commands]
    results = run_tools(cases, tmp_path, timeout=900)
    for case, r in zip(cases, results):
        assert r["code"] == 0, f"{' '.join(case['argv'])}\n{r['stdout'][-2000:]}\n{r['stderr'][-4000:]}"
    by_doc = {" ".join(c): r for c, r in zip(commands, results)}
    text = lambda key: next(r["stdout"] + r["stderr"] for k, r in by_doc.items() if k.startswith(key))  # noqa: E731

    # 2: classes and ids from the annotation file; num_classes inferred
    first_fit = next(r for c, r in zip(commands, results) if c[:3] == ["tools/train.py", "fit", "--config"]
                     and c[3] == "my_detr.yaml" and len(c) == 4)
    assert f"3 classes from {data / 'annotations' / 'val.json'}: circle (id 3), square (id 7), bar (id 12)" in first_fit["stderr"]
    ckpt = torch.load(out / "my_run" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert ckpt["hyper_parameters"]["num_classes"] == 3 and ckpt["label_to_cat_id"] == {0: 3, 1: 7, 2: 12}
    # 3: the schedule that would never validate validates at the last epoch, and says so
    assert "check_val_every_n_epoch=10 is more than max_epochs=1, so this run would never validate" in first_fit["stderr"]
    assert re.search(r"^epoch 1/1  loss [\d.]+ .* val/mAP [\d.]+", first_fit["stdout"], re.M)
    # 4: where outputs land
    run = out / "my_run"
    for p in ("checkpoints/last.ckpt", "csv/version_0/metrics.csv", "csv/version_0/config.yaml", "tb"):
        assert (run / p).exists(), p
    assert list((run / "checkpoints").glob("epoch000-step*.ckpt"))  # the best by val/mAP
    # 5: fine-tuning: a new head from 91-class DETR weights; all weights from an own checkpoint
    r50_log = text("tools/train.py fit --config configs/detr/detr_r50_finetune_custom.yaml")
    assert "class head not loaded because the number of classes differs (fine-tuning): class_embed.weight (92, 128) -> (4, 128)" in r50_log
    assert (out / "my_run_r50" / "checkpoints" / "last.ckpt").is_file()
    dino_log = text("tools/train.py fit --config configs/deformable_detr/dino_r50_finetune_custom.yaml")
    dino_line = next(ln for ln in dino_log.splitlines() if "class head not loaded because the number of classes differs" in ln)
    assert "label_enc.weight (92, 128) -> (4, 128)" in dino_line and "class_embed.1.bias (91,) -> (3,)" in dino_line
    assert dino_line.endswith("(5 class-dependent tensors re-initialised, every other tensor loaded unchanged)"), dino_line
    assert (out / "my_run_dino" / "checkpoints" / "last.ckpt").is_file()
    finetuned = text("tools/train.py fit --config my_detr.yaml --model.init_args.pretrained")
    assert re.search(rf"loaded \d+ tensors from {re.escape(str(run / 'checkpoints' / 'last.ckpt'))} \(0 head tensors left at init\)",
                     finetuned), finetuned[-3000:]
    # 6: evaluation, predictions and the export keep the real category ids
    assert 0.0 <= json.loads((run / "stats.json").read_text())["map"] <= 1.0
    for folder in ("predictions", "predictions_export"):
        preds = json.loads((run / folder / "predictions.json").read_text())
        assert preds and {p["category_id"] for p in preds} <= set(IDS) and {p["image_id"] for p in preds} <= {101, 102}
        assert len(list((run / folder).glob("*.png"))) == 2
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]" in text("tools/eval.py --annotations")
    labels = json.loads((run / "model.labels.json").read_text())
    assert labels["label_to_cat_id"] == {"0": 3, "1": 7, "2": 12} and labels["class_names"] == ["circle", "square", "bar"]
