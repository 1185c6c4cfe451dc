"""Reading visiontf's Lightning task checkpoints without Lightning: the network and what it needs to predict.

A task checkpoint holds the network's weights (``state_dict`` under ``model.``), the task's
hyper-parameters (``model_name``, ``num_classes``, ``model_kwargs``), the class names and category
ids of its data, and, since visiontf saves it, ``preprocess``: the complete eval preprocessing
(``pretrained_cfg`` keys) resolved by the task's adapter when the checkpoint was written.

Older checkpoints lack ``preprocess``. For them, and only here, :func:`legacy_eval_cfg` derives it
from the data module's saved hyper-parameters by their names, as visiontf did before (the legacy
path; renaming a data-module argument would change what it finds, which is why new checkpoints
store the settings themselves).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn

from visiontf.errors import UserError
from visiontf.weights import WeightsError, safe_torch_load

log = logging.getLogger(__name__)


class CheckpointError(UserError, ValueError):
    """A file given as a visiontf task checkpoint that is not one."""

#: kwargs that point at weight files used only to initialise training; a checkpoint has all weights
INIT_ONLY_KWARGS = ("backbone_pretrained", "encoder_pretrained", "pretrained")


def load_checkpoint_model(ckpt_path: str | Path, strict: bool = True, **overrides: Any) -> tuple[nn.Module, dict[str, Any]]:
    """The plain network of a visiontf Lightning checkpoint, and what it knows about its data.

    Returns ``(model, info)``; ``info`` holds ``preprocess`` (eval settings in ``pretrained_cfg`` keys:
    complete for new checkpoints, what the old hyper-parameters named for legacy ones) and may hold
    ``class_names`` and ``label_to_cat_id``, besides the raw ``hyper_parameters`` and
    ``datamodule_hyper_parameters``.

    Weights that do not fit the rebuilt model as saved (a checkpoint of an earlier visiontf whose
    layout changed since) go through the family's ``filter_fn`` (:func:`visiontf.registry.convert_state`);
    where it names constructor arguments that rebuild their structure exactly, the model is built
    with them. ``strict=False`` loads what fits and leaves the rest at init; ``overrides`` are
    constructor arguments on top of the saved ``model_kwargs``.
    """
    from visiontf.registry import WeightsLayoutError, convert_state, create_model

    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    ckpt = safe_torch_load(path)
    hp = dict(ckpt.get("hyper_parameters") or {})
    if "model_name" not in hp or "state_dict" not in ckpt:
        raise CheckpointError(
            f"{path}: not a visiontf task checkpoint (needs 'hyper_parameters.model_name' and 'state_dict'; "
            f"has keys {sorted(ckpt)[:10]}). For a plain state dict use create_model(name, pretrained=path)."
        )
    kwargs = {k: v for k, v in dict(hp.get("model_kwargs") or {}).items() if k not in INIT_ONLY_KWARGS}
    kwargs.update(overrides)
    model = create_model(hp["model_name"], num_classes=hp.get("num_classes"), **kwargs)
    saved = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    # nn.Module.compile keeps names, but torch.compile(model) adds "_orig_mod."
    saved = {k.replace("_orig_mod.", ""): v for k, v in saved.items()}
    state = saved
    if not _fits_as_saved(model, saved):
        try:
            state = convert_state(model, dict(saved), strict=strict)
        except WeightsLayoutError as e:
            if not e.fits_kwargs or set(e.fits_kwargs) & set(overrides):
                raise
            log.warning("%s: written by an earlier visiontf; rebuilt as %s with %s, the structure of its weights",
                        path, hp["model_name"], e.fits_kwargs)
            model = create_model(hp["model_name"], num_classes=hp.get("num_classes"), **{**kwargs, **e.fits_kwargs})
            state = convert_state(model, dict(saved), strict=strict)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if strict and (missing or unexpected):
        raise WeightsError(
            f"{path}: weights do not fit {hp['model_name']}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if missing:
        log.warning("%s: %d tensors of %s left at init (strict=False), e.g. %s", path, len(missing), hp["model_name"],
                    missing[:5])
    dm = dict(ckpt.get("datamodule_hyper_parameters") or {})
    info: dict[str, Any] = {"hyper_parameters": hp, "datamodule_hyper_parameters": dm}
    names = ckpt.get("class_names") or hp.get("class_names") or dm.get("class_names")
    if names:
        info["class_names"] = list(names)
    if ckpt.get("label_to_cat_id"):
        info["label_to_cat_id"] = {int(k): int(v) for k, v in ckpt["label_to_cat_id"].items()}
    if ckpt.get("preprocess") is not None:
        info["preprocess"] = dict(ckpt["preprocess"])
        source = "saved with the checkpoint"
    else:
        info["preprocess"] = legacy_eval_cfg(dm, hp)
        source = "derived from the legacy hyper-parameters"
    log.info("%s: rebuilt %s (%d tensors); preprocessing %s: %s", path, hp["model_name"], len(state), source,
             info["preprocess"] or "model defaults")
    return model, info


def legacy_eval_cfg(datamodule_hparams: dict[str, Any] | None, task_hparams: dict[str, Any] | None = None) -> dict[str, Any]:
    """LEGACY: the eval settings (``pretrained_cfg`` keys) that a data module's and a task's saved
    hyper-parameters imply, found by their names.

    Only for checkpoints written before visiontf stored ``preprocess``, and for ``--config`` files
    whose data module cannot be built; new code asks the data module (``eval_cfg()``) and the task.
    Keys set: ``mean``/``std``, ``input_size``/``crop_pct`` (classification), ``min_size``/``max_size``
    from ``val_size``/``max_size`` (COCO), ``resize`` from ``val_resize``/``base_size``/``layout``
    (segmentation), ``test_mode``/``crop_size``/``stride`` from the task's ``inference_mode``.
    """
    dm, hp = datamodule_hparams or {}, task_hparams or {}
    cfg: dict[str, Any] = {}
    for key in ("mean", "std"):
        if dm.get(key) is not None:
            cfg[key] = tuple(dm[key])
    if dm.get("image_size") is not None:
        s = dm["image_size"]
        cfg["input_size"] = (s, s) if isinstance(s, int) else tuple(s)
    if dm.get("crop_pct") is not None:
        cfg["crop_pct"] = float(dm["crop_pct"])
    if dm.get("val_size") is not None:
        cfg["min_size"] = int(dm["val_size"])
        if dm.get("max_size") is not None:
            cfg["max_size"] = int(dm["max_size"])
    if isinstance(dm.get("val_resize"), (list, tuple)):
        cfg["resize"] = tuple(dm["val_resize"])
    elif dm.get("val_resize") is True and (dm.get("base_size") is not None or dm.get("layout")):
        base = dm.get("base_size")
        if base is None:
            from visiontf.data.segmentation_labels import LAYOUTS

            base = LAYOUTS.get(dm["layout"], {}).get("base_size")
        if base is not None:
            cfg["resize"] = tuple(base)
    if hp.get("inference_mode") in ("whole", "slide"):
        cfg["test_mode"] = hp["inference_mode"]
        if hp.get("crop_size"):
            cfg["crop_size"] = hp["crop_size"]
        if hp.get("stride"):
            cfg["stride"] = hp["stride"]
    return cfg


def _fits_as_saved(model: nn.Module, state: dict[str, Any]) -> bool:
    """Whether ``state`` has exactly ``model``'s keys and shapes (a checkpoint of this visiontf)."""
    own = model.state_dict()
    return own.keys() == state.keys() and all(tuple(own[k].shape) == tuple(state[k].shape) for k in own)
