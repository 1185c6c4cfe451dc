"""Command lines behind ``tools/predict.py`` and ``tools/export.py``: a model from a checkpoint or an
export, then the task's adapter does the rest (pictures, ``predictions.json``, attention, ONNX).

Both take options in ``tools/train.py``'s style (``--ckpt_path``, ``--score_threshold``) and ``--data.*`` overrides of the ``--config``'s data
section as ``tools/train.py`` does (``--data.root DIR``, ``--data.init_args.val_ann FILE``). The class
names and category ids saved with a checkpoint or an export win over a config's; a config whose
classes differ is an error that says to drop it.

The options of one task (``--min_size``, ``--seg_mode``, ``--restore_task``, ``--postprocess.*``) are
the adapters' own (``TaskAdapter.predict_options``): given for a model of another task, they are
refused by name. torch and the adapters are imported only once the other arguments are checked (or
when a task option is given), so a mistake in those is reported in about a second.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from visiontf.cli.checks import checkpoint_file, input_paths, output_folder, weights_file
from visiontf.cli.tool_errors import run_tool
from visiontf.core.arguments import ToolParser
from visiontf.core.errors import UsageError

log = logging.getLogger(__name__)

#: train.py options that predict/export do not take, and what to use instead
_NOT_HERE = {
    "--trainer.accelerator": "--device (cpu, cuda, cuda:1)",
    "--trainer.devices": "--device (cpu, cuda, cuda:1): prediction runs on one device",
    "--trainer.": "nothing: prediction needs no trainer (see --help)",
    "--model.": "nothing: the model and its settings come from --ckpt_path or --weights",
    "--seed_everything": "nothing: prediction is deterministic",
    "--checkpoint.": "nothing: prediction writes no checkpoints",
}


# ---------------------------------------------------------------------------------------- arguments
def split_data_overrides(argv: Sequence[str], prog: str) -> tuple[list[str], dict[str, str]]:
    """Take ``--data.KEY VALUE`` / ``--data.KEY=VALUE`` out of ``argv``; refuse train.py's other sections.

    Returns the remaining arguments and ``{KEY: VALUE}`` (``KEY`` as given: ``root``,
    ``init_args.root``, ``class_path``).
    """
    rest: list[str] = []
    overrides: dict[str, str] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if name.startswith("--data."):
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                i += 1
                value = args[i]
            else:
                raise UsageError(f"{name} needs a value")
            overrides[name[len("--data."):]] = value
        else:
            for prefix, instead in _NOT_HERE.items():
                if name == prefix or (prefix.endswith(".") and name.startswith(prefix)):
                    raise UsageError(f"{prog} does not take {name} (a tools/train.py option); use {instead}")
            rest.append(arg)
        i += 1
    return rest, overrides


def _data_parser():
    """The ``data`` section's parser, as LightningCLI builds it for ``tools/train.py`` (subclass mode:
    any VisionDataModule, untyped arguments taken as they are, mistakes raised instead of printed)."""
    from jsonargparse import ArgumentParser

    from visiontf.cli.config_imports import restrict_config_imports
    from visiontf.data.base import VisionDataModule
    from visiontf.tasks.task_table import data_module_class_paths, import_class

    # every data module of the task table imported, so that a short class_path ("CocoDataModule")
    # resolves among the imported subclasses as it does for tools/train.py
    for class_path in data_module_class_paths():
        import_class(class_path)
    restrict_config_imports()  # the section names visiontf's data modules only (visiontf.cli.config_imports)
    parser = ArgumentParser(exit_on_error=False, allow_abbrev=False)
    parser.add_subclass_arguments(VisionDataModule, "data", fail_untyped=False, required=True)
    return parser


def datamodule_from_config(config: str | Path | None, overrides: dict[str, str] | None = None,
                           required: bool = False) -> tuple[Any | None, dict[str, Any]]:
    """Instantiate the YAML's ``data`` section (with ``--data.*`` ``overrides``) and return it and its init args.

    The section and the overrides go through jsonargparse as ``tools/train.py``'s do: values are
    type-checked and coerced (``--data.init_args.batch_size 4`` is an int), an unknown key is refused
    naming it, a short ``class_path`` names one of the task table's data modules.

    The data gives class names and category ids for checkpoints that lack them. When it cannot be
    built (the data moved) this returns ``(None, init_args)`` with a warning, unless ``required``
    (``--data.*`` options were given: the user asked for this data), which raises.
    """
    import argparse
    import json

    import yaml

    from visiontf.core.config_files import read_config

    overrides = overrides or {}
    if config is None:
        if overrides:
            raise UsageError(f"--data.{next(iter(overrides))} needs --config (the config names the data module)")
        return None, {}
    path = Path(config)
    if not path.is_file():
        raise UsageError(f"--config {path}: file not found")
    try:
        cfg = read_config(path)  # with its base files (a variant's config: key)
    except yaml.YAMLError as e:
        raise UsageError(f"--config {path}: not valid YAML ({' '.join(str(e).split())})") from e
    data = cfg.get("data") if isinstance(cfg, dict) else None
    if not (isinstance(data, dict) and data.get("class_path")) and "class_path" not in overrides:
        if overrides:
            raise UsageError(f"--data.{next(iter(overrides))}: --config {path} has no data section with a class_path "
                             "to apply it to; give the config the model was trained with")
        return None, {}
    from visiontf.cli.config_imports import CodeInConfigError, denied_import_message, refuse_code_in_config
    from visiontf.cli.tool_errors import user_message

    parser = _data_parser()
    # the config's section first, then the overrides over it, in the command line's order
    argv = [f"--data={json.dumps(data or {}, default=str)}", *(f"--data.{k}={v}" for k, v in overrides.items())]
    init_args: dict[str, Any] = dict((data or {}).get("init_args") or {})
    try:
        parsed = parser.parse_args(argv)
        refuse_code_in_config(parsed)
        init_args = parsed.data.init_args.as_dict()
        return parser.instantiate_classes(parsed).data, init_args
    except Exception as e:  # noqa: BLE001 - the data is optional for prediction
        denied = denied_import_message(e)
        if denied is not None:  # not data that moved: a file naming what visiontf never imports
            raise UsageError(f"--config {path}: {denied}") from None
        if isinstance(e, CodeInConfigError):
            raise UsageError(f"--config {path}: {e}") from None
        message = user_message(e)
        if required:
            if isinstance(e, argparse.ArgumentError):  # the parser's words name the key; say where it came from
                raise UsageError(f"{message} (--config {path}'s data section with the --data.* options)") from e
            raise
        log.warning("%s: could not build the data module %s (%s); class names come from the checkpoint or "
                    "fall back to class_<i>", config, (data or {}).get("class_path"), message or f"{type(e).__name__}: {e}")
        return None, init_args


# ---------------------------------------------------------------------------------------- classes
def resolve_classes(saved_names: Sequence[str] | None, saved_ids: dict[int, int] | None,
                    config_names: Sequence[str] | None, config_ids: dict[int, int] | None,
                    saved: str, config: str) -> tuple[list[str] | None, dict[int, int] | None]:
    """Class names and label -> category id tables: what the checkpoint/export saved wins over the config.

    A config whose names or ids differ from the saved ones is a :class:`UsageError` naming both and
    saying to drop ``--config`` (the saved ones are what the model was trained on).
    """
    names = list(saved_names) if saved_names else None
    ids = {int(k): int(v) for k, v in saved_ids.items()} if saved_ids else None
    cfg_names = list(config_names) if config_names else None
    cfg_ids = {int(k): int(v) for k, v in config_ids.items()} if config_ids else None

    if names and cfg_names and (names != cfg_names or (ids and cfg_ids and ids != cfg_ids)):
        from visiontf.tasks.checkpoints import describe_classes

        raise UsageError(f"{saved} was trained on {describe_classes(names, ids)} but {config} has "
                         f"{describe_classes(cfg_names, cfg_ids)}; "
                         f"drop --config (the checkpoint carries its classes), or give the config it was trained with")
    return (names or cfg_names), (ids or (cfg_ids if not names or names == cfg_names else None))


# ---------------------------------------------------------------------------------------- task options
def task_options() -> dict[str, tuple[Any, ...]]:
    """Each task's ``tools/predict.py`` options (:class:`~visiontf.tasks.eval_settings.PredictOption`), declared
    by its adapter (importing the adapters imports torch)."""
    from visiontf.tasks.task_table import TASK_TABLE, import_class

    return {task: tuple(import_class(row.adapter).predict_options) for task, row in TASK_TABLE.items()}


def given_task_options(args: argparse.Namespace, adapter: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The task options given on the command line, as ``(eval settings, post-processing options)`` of
    ``adapter``'s task; an option only other tasks have is refused, naming them."""
    preprocess: dict[str, Any] = {}
    postprocess: dict[str, Any] = {}
    everyone = task_options()
    for option in dict.fromkeys(o for options in everyone.values() for o in options):
        value = getattr(args, option.dest, None)
        if value is None:
            continue
        if option not in adapter.predict_options:
            owners = " and ".join(t for t, options in everyone.items() if option in options)
            own = ", ".join(o.flag for o in adapter.predict_options) or "none"
            raise UsageError(f"{option.flag}: an option of {owners} models, but this is a {adapter.task} model "
                             f"(its options: {own})")
        (preprocess if option.section == "preprocess" else postprocess)[option.key] = value
    return preprocess, postprocess


# ---------------------------------------------------------------------------------------- predictor
def build_predictor(args: argparse.Namespace, data_overrides: dict[str, str] | None = None):
    """A Predictor from ``--weights`` or ``--ckpt_path`` (+ ``--config`` for classes of old checkpoints).

    Preprocessing: the settings saved with the checkpoint or export, the task's options on top (the
    ``--config`` gives class names and category ids only).
    """
    from visiontf.inference.predictor import Predictor, saved_settings
    from visiontf.io.weights import labels_path, read_labels_file
    from visiontf.models import load_model
    from visiontf.tasks.checkpoints import load_checkpoint_model
    from visiontf.tasks.task_inference import get_adapter

    config = getattr(args, "config", None)
    dm, _ = datamodule_from_config(config, data_overrides, required=bool(data_overrides))
    cfg_names, cfg_ids = (dm.class_names, dm.label_to_cat_id) if dm is not None else (None, None)
    if args.weights:
        model, info = load_model(args.weights), read_labels_file(args.weights)
        source, where = f"--weights {args.weights}", f"{labels_path(args.weights)}: its preprocess"
    else:
        model, info = load_checkpoint_model(args.ckpt_path)
        source, where = f"--ckpt_path {args.ckpt_path}", f"{args.ckpt_path}: its saved preprocess"
    names, ids = resolve_classes(info.get("class_names"), info.get("label_to_cat_id"), cfg_names, cfg_ids,
                                 source, f"--config {config}")
    n = model.num_classes
    if names and n and len(names) != n:
        if info.get("class_names"):  # the file's own table disagrees with its own model: nothing to drop, a damaged file
            raise UsageError(f"{source}: its saved class_names hold {len(info['class_names'])} names but its model has {n} "
                             "classes; re-export the model from its training checkpoint")
        raise UsageError(f"--config {config}: its data has {len(names)} classes but the checkpoint's model has {n}; "
                         "drop --config, or give the config it was trained with")
    adapter = get_adapter(model)
    preprocess, postprocess = given_task_options(args, adapter)
    settings = saved_settings(adapter, model, info.get("preprocess"), where, preprocess)
    general = {k: getattr(args, k) for k in ("batch_size", "device", "num_workers", "precision") if getattr(args, k) is not None}
    return Predictor(model, class_names=names, preprocess=settings, label_to_cat_id=ids, postprocess=postprocess or None,
                     **general)


def _resolve_last(ckpt_path: str, config: str | None) -> str:
    """``last`` is the run's ``last.ckpt`` under the config's ``default_root_dir`` (an error when absent:
    never predict or export with random weights), ``best`` the best checkpoint it records; other values pass
    through."""
    if str(ckpt_path) not in ("last", "best"):
        return ckpt_path
    from visiontf.tasks.checkpoints import config_checkpoint_dir, resolve_checkpoint

    return resolve_checkpoint(ckpt_path, config_checkpoint_dir(config))


def _model_source(args: argparse.Namespace) -> None:
    if args.weights and args.ckpt_path:
        raise UsageError("give --ckpt_path or --weights, not both")
    if not args.weights and not args.ckpt_path:
        raise UsageError("give --ckpt_path K.ckpt (a training checkpoint) or --weights model.safetensors (an export)")
    if args.ckpt_path:
        args.ckpt_path = str(checkpoint_file(_resolve_last(args.ckpt_path, args.config)))
    else:
        args.weights = str(weights_file(args.weights))


def predict_parser(with_task_options: bool = True) -> ToolParser:
    """``tools/predict.py``'s options; with ``with_task_options`` also every task's (importing the adapters)."""
    p = ToolParser(prog="predict.py", description="Predict with a visiontf checkpoint or exported model. "
                   "Also takes tools/train.py's --data.* overrides of the config's data section.")
    p.add_argument("--config", help="training YAML: class names and category ids of checkpoints that lack them")
    p.add_argument("--ckpt_path", help="Lightning checkpoint (.ckpt)")
    p.add_argument("--weights", help="exported model (.safetensors from tools/export.py) instead of a checkpoint")
    p.add_argument("--input", nargs="+", required=True, help="image files and/or folders")
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument("--score_threshold", type=float, default=0.5, help="detection score threshold (default 0.5)")
    p.add_argument("--top_k", type=int, default=None, help="classes (classification, default 5) or max detections")
    p.add_argument("--annotations", help="COCO annotation file: image ids (by file name) and category ids for predictions.json")
    p.add_argument("--attention", action="store_true", help="also save DETR attention maps / ViT attention rollout")
    p.add_argument("--batch_size", type=int, default=None)
    p.add_argument("--num_workers", type=int, default=None,
                   help="processes decoding the images (default: up to 4 when there is more than one batch)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--precision", choices=("32-true", "bf16-mixed", "16-mixed"), default=None,
                   help="the model's forward under autocast, as trainer.precision (default 32-true)")
    p.add_argument("--quiet", action="store_true", help="no progress bars and no INFO lines (warnings and errors stay)")
    if with_task_options:
        added: dict[str, Any] = {}
        for task, options in task_options().items():
            if not options:
                continue
            group = p.add_argument_group(f"{task} options", f"for {task} models (declared by the task's adapter)")
            for option in options:
                if option.flag in added:  # two tasks sharing an option must mean the same by it
                    if added[option.flag] != option:
                        raise ValueError(f"{option.flag}: declared differently by two adapters: {added[option.flag]} "
                                         f"and {option}")
                    continue
                added[option.flag] = option
                option.add_to(group)
    return p


def _check_predict_values(args: argparse.Namespace) -> None:
    """Values argparse's types let through but that would give a traceback or, worse, silently no results."""
    for name in ("batch_size", "num_workers", "top_k"):
        value, least = getattr(args, name, None), 0 if name == "num_workers" else 1
        if value is not None and value < least:
            raise UsageError(f"--{name} {value}: must be >= {least}")
    t = args.score_threshold
    if t is not None and not 0.0 <= t < 1.0:  # NaN fails both comparisons
        raise UsageError(f"--score_threshold {t}: scores are in [0, 1), so this keeps nothing; give a value in [0, 1)")
    if args.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?|mps", args.device):
        raise UsageError(f"--device {args.device}: use cpu, cuda or cuda:N (or mps)")
    if args.device is not None and args.device != "cpu":  # before the model is read: a GPU that is not there
        from visiontf.inference.predictor import DeviceError, resolve_device

        try:
            resolve_device(args.device)
        except DeviceError as e:
            raise UsageError(f"--{e}") from None


def _predict(argv: Sequence[str]) -> int:
    argv, data_overrides = split_data_overrides(argv, "predict.py")
    if "-h" in argv or "--help" in argv:
        predict_parser().parse_args(argv)  # the help lists every task's options
    # the options every task has, checked before torch is imported; the tasks' own options after
    shared = predict_parser(with_task_options=False)
    if shared.unknown_options(argv):  # a task's option, or a typo: named before any other mistake
        predict_parser().refuse_unknown_options(argv)
    args, rest = shared.parse_known_args(argv)
    _check_predict_values(args)
    _model_source(args)
    input_paths(args.input)
    out = output_folder(args.output)
    if args.annotations and not Path(args.annotations).is_file():
        raise UsageError(f"--annotations {args.annotations}: file not found")
    if rest:  # an option no task has is refused here, with the closest ones
        args = predict_parser().parse_args(argv)
        _model_source(args)
    quiet_or_not(args.quiet)

    from visiontf.inference.predict_files import predict_to_folder

    predictor = build_predictor(args, data_overrides)
    adapter = predictor.adapter
    if args.annotations and predictor.class_names is None:
        names = adapter.annotation_class_names(args.annotations)
        if names and predictor.num_classes in (None, len(names)):
            predictor.class_names = names
    if args.annotations:
        adapter.check_annotation_classes(args.annotations, predictor.class_names, predictor.label_to_cat_id)
    # streamed: files decoded in DataLoader workers, each result written as it comes (bounded memory)
    predict_to_folder(predictor, args.input, out, annotations=args.annotations,
                      score_threshold=args.score_threshold, top_k=args.top_k, attention=args.attention)
    return 0


def predict_main(argv: Sequence[str] | None = None) -> int:
    """``tools/predict.py``: annotated images, ``predictions.json`` and optional attention pictures."""
    return run_tool(_predict, argv, prog="predict.py")


# ---------------------------------------------------------------------------------------- export
def quiet_or_not(quiet: bool) -> None:
    """A tool's output: progress bars and INFO lines, or with ``--quiet`` warnings and errors only."""
    from visiontf.core.progress import set_progress

    set_progress(not quiet)
    level = logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)  # also where logging was configured before (a tool run from Python)


def export_parser() -> ToolParser:
    p = ToolParser(prog="export.py", description="Export a visiontf checkpoint to safetensors and ONNX.")
    p.add_argument("--quiet", action="store_true", help="no progress bars and no INFO lines (warnings and errors stay)")
    p.add_argument("--ckpt_path", required=True, help="Lightning checkpoint (.ckpt)")
    p.add_argument("--config", help="training YAML: class names and category ids of checkpoints that lack them")
    p.add_argument("--output", required=True, help="model.safetensors")
    p.add_argument("--onnx", help="also write this ONNX file")
    p.add_argument("--image_size", type=int, nargs=2, metavar=("H", "W"), help="ONNX example input size")
    p.add_argument("--no_check", dest="check", action="store_false", help="skip the onnxruntime comparison")
    p.add_argument("--rtol", type=float, help="the check: raw outputs may differ by atol + rtol * |PyTorch| "
                   "(default: visiontf.inference.onnx_check.ExportTolerance, 1e-3), detections by float32 noise")
    p.add_argument("--atol", type=float, help="see --rtol (default 1e-3)")
    return p


def _export(argv: Sequence[str]) -> int:
    argv, data_overrides = split_data_overrides(argv, "export.py")
    args = export_parser().parse_args(argv)
    ckpt = checkpoint_file(_resolve_last(args.ckpt_path, args.config))
    quiet_or_not(args.quiet)

    import torch

    from visiontf.inference.export import export_model
    from visiontf.inference.onnx_check import ExportTolerance
    from visiontf.inference.predictor import saved_settings
    from visiontf.tasks.checkpoints import load_checkpoint_model
    from visiontf.tasks.task_inference import get_adapter

    model, info = load_checkpoint_model(ckpt)
    dm, _ = datamodule_from_config(args.config, data_overrides, required=bool(data_overrides))
    cfg_names, cfg_ids = (dm.class_names, dm.label_to_cat_id) if dm is not None else (None, None)
    names, l2c = resolve_classes(info.get("class_names"), info.get("label_to_cat_id"), cfg_names, cfg_ids,
                                 f"--ckpt_path {ckpt}", f"--config {args.config}")
    settings = saved_settings(get_adapter(model), model, info.get("preprocess"), f"{ckpt}: its saved preprocess")
    with torch.no_grad():
        report = export_model(model, args.output, names, l2c, settings,
                              onnx=args.onnx, image_size=args.image_size, check=args.check,
                              tolerance=ExportTolerance(**{k: v for k, v in {"rtol": args.rtol, "atol": args.atol}.items() if v is not None}))
    print(json.dumps(report, indent=2))
    return 0


def export_main(argv: Sequence[str] | None = None) -> int:
    """``tools/export.py``: safetensors + config (+ labels) and optionally ONNX checked with onnxruntime."""
    return run_tool(_export, argv, prog="export.py")


__all__ = ["build_predictor", "datamodule_from_config", "export_main", "predict_main", "resolve_classes",
           "split_data_overrides"]
