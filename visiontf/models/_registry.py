"""Named model configurations, like timm's ``@register_model``: the table and the factory.

Public path: :mod:`visiontf.models` (``visiontf.create_model`` and friends at the top). This module
sits inside the ``models`` package so that importing it runs ``visiontf/models/__init__.py`` first, which imports every family; each family
module registers its names with :func:`register_model` as it loads. Nothing here imports a family.

``create_model(name, pretrained=None, num_classes=None, **kwargs)`` builds a plain ``nn.Module``.
``pretrained`` is a local file (``.safetensors``, or ``.pth``/``.pt`` read with
``weights_only=True``) or ``True`` to fetch the published weights through timm's / torch hub's own
download code.
"""
from __future__ import annotations

import difflib
import fnmatch
import inspect
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from visiontf.core.errors import UserError
from visiontf.core.saved_arguments import short_repr
from visiontf.io.weights import (
    INIT_ONLY_KWARGS,
    WEIGHT_FILE_KEYS,
    WeightsError,
    check_tensor_values,
    load_state_dict_file,
    read_config,
    read_weights_file,
    restoring_weights,
    weights_from_checkpoint,
)

log = logging.getLogger(__name__)


class ModelNameError(UserError, ValueError):
    """An unknown model name, or ``pretrained=True`` for a model without published weights."""


class ModelArgumentError(UserError, ValueError):
    """A model's constructor refused its arguments (a config's ``model_kwargs``): the family's own words, one line."""


class WeightsLayoutError(UserError, ValueError):
    """Weights that the model, as built, cannot take exactly (a family's ``filter_fn`` says what differs,
    and which registered model they fit where one does)."""


@dataclass
class ModelEntry:
    """One registered model name: its constructor, where published weights come from, how foreign
    state dicts are adapted (``filter_fn``), and its tags (the task first, then the family)."""

    name: str
    fn: Callable[..., nn.Module]
    #: where ``pretrained=True`` gets weights: a callable returning a state dict, or None
    fetch_pretrained: Callable[[], dict] | None = None
    #: adapts a foreign state dict (original DETR, HF, timm at another size) to this model; one that
    #: takes a ``strict`` keyword gets the loader's (False: load what fits, leave the rest at init)
    filter_fn: Callable[..., dict] | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)
    #: the model's ``features_only`` form: ``features_fn(model, name=, out_indices=, output_fmt=)`` (timm's
    #: ``FeatureGetterNet`` for the ViTs); None: the model has none
    features_fn: Callable[..., nn.Module] | None = None
    #: the smallest settings the model builds with, keeping every kind of part it has, and the image size its
    #: example inputs take then: what the registry-wide test builds every entry with (tests/models/test_registry.py)
    test_kwargs: Mapping[str, Any] = field(default_factory=dict)
    test_image_size: tuple[int, int] | None = None


#: the keyword arguments of ``create_model`` that belong to ``features_only`` (timm's spelling)
FEATURE_KWARGS = ("out_indices", "output_fmt")

_REGISTRY: dict[str, ModelEntry] = {}


def register_model(fn=None, *, name: str | None = None, fetch_pretrained=None, filter_fn=None, tags=(), features_fn=None,
                   test_kwargs: Mapping[str, Any] | None = None, test_image_size: tuple[int, int] | None = None):
    """Decorator registering a model constructor under its function name (or ``name``); ``test_kwargs`` and
    ``test_image_size``: the smallest settings it builds with (:class:`ModelEntry`)."""

    def wrap(f):
        key = name or f.__name__
        if key in _REGISTRY:
            raise ValueError(f"model {key!r} registered twice")
        _REGISTRY[key] = ModelEntry(key, f, fetch_pretrained, filter_fn, tuple(tags), features_fn, dict(test_kwargs or {}),
                                    test_image_size)
        return f

    return wrap(fn) if fn is not None else wrap


def list_models(pattern: str | None = None) -> list[str]:
    """Registered model names, optionally filtered by a shell-style pattern (``"detr_*"``)."""
    names = sorted(_REGISTRY)
    if pattern:
        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    return names


def get_entry(name: str) -> ModelEntry:
    """The registry entry of ``name``; an unknown name is an error listing the closest names."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ModelNameError(f"unknown model {name!r}.{hint} See visiontf.list_models() for all {len(_REGISTRY)} names.")
    return _REGISTRY[name]


def _keyword_hint(error: BaseException) -> str:
    """``"; did you mean 'arch'? It takes: arch, backbone, ..."`` for a TypeError naming an unexpected keyword, from
    the signature of the callable the message names (found in the frame that called it); ``""`` where it is not found.

    A family's builder passes the caller's keywords down through ``**kwargs``, so only the callee that refused one
    knows the names it takes: the message names it (``DETR.__init__()``, ``build_rtdetr()``)."""
    import re

    found = re.search(r"(\w+(?:\.\w+)*)\(\) got an unexpected keyword argument '(\w+)'", str(error))
    if not found or error.__traceback__ is None:
        return ""
    qualname, bad = found.groups()
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    owner = qualname[: -len(".__init__")] if qualname.endswith(".__init__") else qualname
    target = None
    for value in (*tb.tb_frame.f_locals.values(), *tb.tb_frame.f_globals.values()):
        if getattr(value, "__qualname__", None) == owner and callable(value):
            target = value
            break
    if target is None:
        return ""
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return ""
    names = sorted(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self")
    if not names:
        return ""
    close = difflib.get_close_matches(bad, names, n=1, cutoff=0.6)
    return (f"; did you mean {close[0]!r}?" if close else ".") + f" It takes: {', '.join(names)}"


def _construct(entry: ModelEntry, kwargs: dict[str, Any]) -> nn.Module:
    """``entry.fn(**kwargs)``; the family's refusal of an argument as one :class:`ModelArgumentError` line."""
    try:
        return entry.fn(**kwargs)
    except UserError:
        raise
    except (ValueError, TypeError) as e:
        # the family checks its arguments (IPT's tile_size, DETR's hidden_dim) with ValueError; a keyword it
        # does not take is a TypeError. Either is the config's mistake, not a bug: one line, naming the model
        if isinstance(e, TypeError) and "keyword" not in str(e):
            raise
        raise ModelArgumentError(f"{entry.name}: {e}{_keyword_hint(e)} (the model's arguments: a config's "
                                 "model.init_args.model_kwargs, or create_model's keywords)") from e


def without_weight_files(value: Any) -> Any:
    """``value`` with every entry of :data:`WEIGHT_FILE_KEYS` of its mappings, at any depth, set to None: for
    building a model whose weights come from elsewhere (a checkpoint, an export, none at all), so that no other file
    is read, nor one a saved config names."""
    if isinstance(value, Mapping):
        return {k: None if k in WEIGHT_FILE_KEYS else without_weight_files(v) for k, v in value.items()}
    return value


def check_model_arguments(name: str, num_classes: int | None = None, **kwargs: Any) -> nn.Module:
    """The model ``create_model(name, num_classes=num_classes, **kwargs)`` builds, built on PyTorch's meta device:
    the same checks, before anything is allocated, read or downloaded.

    What the constructor refuses is refused here with the same error (an unknown name: :class:`ModelNameError`;
    a misspelt keyword, a value of the wrong type or out of range: :class:`ModelArgumentError`), so a config's
    mistake is found when the config is parsed (``tools/train.py ... --print_config`` included) rather than when
    its run starts. No weights are read or fetched: every ``pretrained`` in ``kwargs``, at any depth (a backbone
    section's), is left out; the returned model's parameters are shapes without data.
    """
    entry = get_entry(name)
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    with torch.device("meta"):
        return _construct(entry, without_weight_files(kwargs))


def create_model(
    name: str,
    pretrained: bool | str | Path | None = None,
    num_classes: int | None = None,
    strict: bool = True,
    features_only: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """Build a registered model; optionally load weights from a file or the published source.

    ``features_only=True`` (ViTs and DeiTs) returns the model as timm's feature wrapper over
    ``out_indices`` (default the last 3 blocks; ``output_fmt`` "NCHW" or "NLC"), after the weights are
    loaded: the registered ``features_fn`` (the ViTs': :func:`visiontf.models.vit.features.features_only`).

    Within :func:`visiontf.io.weights.weights_from_checkpoint` (a checkpoint's weights follow) no weight file is read:
    neither ``pretrained`` nor one the keywords name.
    """
    entry = get_entry(name)
    if restoring_weights():  # a checkpoint's state dict replaces every weight: no file to start from is read
        pretrained = None
        kwargs = without_weight_files({k: v for k, v in kwargs.items() if k not in INIT_ONLY_KWARGS})
    feature_kwargs = {}
    if features_only:
        if entry.features_fn is None:
            raise ModelArgumentError(f"{name} has no features_only form (only the ViTs and DeiTs have); for a detector "
                                     "backbone use visiontf.models.backbones.build.build_backbone")
        feature_kwargs = {k: kwargs.pop(k) for k in FEATURE_KWARGS if k in kwargs}
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    model = _construct(entry, kwargs)
    model.model_name = name
    model.model_kwargs = dict(kwargs)
    if pretrained:
        if pretrained is True:
            if entry.fetch_pretrained is None:
                url = getattr(getattr(model, "pretrained_cfg", None), "url", None)
                if url:  # published where visiontf does not download from (GitHub release assets, Google Drive)
                    raise ModelNameError(f"{name}: pretrained=True fetches no file for this model; its published weights "
                                         f"are {url}: download that file and pass it as pretrained=PATH")
                raise ModelNameError(f"{name} has no published weights; pass a local file as pretrained=PATH")
            state = entry.fetch_pretrained()
        else:
            weights = read_weights_file(pretrained)
            state = weights.state
            _warn_if_saved_otherwise(name, kwargs, weights.saved_config, str(pretrained))
        load_pretrained(model, state, entry, strict=strict, source=str(pretrained))
    if features_only:
        model = entry.features_fn(model, name=name, **feature_kwargs)
        model.model_name = name
        model.model_kwargs = dict(kwargs, features_only=True, **feature_kwargs)
    return model


def _warn_if_saved_otherwise(name: str, kwargs: Mapping[str, Any], saved: Mapping[str, Any] | None, source: str) -> None:
    """Warn when ``source`` says it holds ``name`` saved with other settings than ``kwargs``: the weights load, yet
    settings that no tensor's shape shows (queries, their selection, a sampling method) would compute otherwise,
    unseen. The number of classes is left out (a new head is what fine-tuning asks for), and so are weight files."""
    if saved is None or saved["model_name"] != name:
        return

    def plain(value: Any) -> Any:  # a saved list and a given tuple are one setting; a weight file to start from is none
        if isinstance(value, Mapping):
            kept = {k: plain(v) for k, v in value.items() if k not in WEIGHT_FILE_KEYS}
            return {k: v for k, v in kept.items() if v != {}}
        return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value

    def settings(values: Mapping[str, Any]) -> dict[str, Any]:
        return plain({k: v for k, v in values.items() if k not in INIT_ONLY_KWARGS and k != "num_classes"})

    theirs, ours = settings(saved["model_kwargs"]), settings(kwargs)
    differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
    if not differ:
        return
    saved_with = ", ".join(f"{k}={short_repr(theirs[k])}" for k in differ if k in theirs) or "the defaults"
    built_with = ", ".join(f"{k}={short_repr(ours[k])}" for k in differ if k in ours) or "the defaults"
    log.warning("%s holds %s saved with %s; create_model built it with %s. Its weights load, but where a setting changes "
                "no tensor's shape the model computes otherwise. For the model as saved use visiontf.load_model (an "
                "export) or visiontf.tasks.checkpoints.load_checkpoint_model (a task checkpoint); to fine-tune with its "
                "settings pass them to create_model", source, name, saved_with, built_with)


def load_pretrained(model: nn.Module, state: dict, entry: ModelEntry | None = None, strict: bool = True, source: str = "",
                    saved_config: dict | None = None) -> None:
    """Load a (possibly foreign-format) state dict; fine-tuning re-initialises the class-dependent tensors.

    Every tensor of ``state`` (after the family's ``filter_fn``) loads unchanged, except those under
    the model's ``head_prefixes`` (class heads, DINO's denoising label book: tensors whose shape
    follows ``num_classes``) when their shape differs or the file lacks them: those keep the model's
    initialisation and are listed in one warning, as timm and torchvision do for ``num_classes``.

    Raises:
        WeightsLayoutError: the weights need another architecture: a setting the model's
            ``weights_settings`` reads back differs (``num_queries``, ``num_feature_levels``, ...; the
            message names it and the value to build with), another tensor has another shape (models
            with ``weights_settings``; with ``strict=False`` what fits loads instead), or the family's
            ``filter_fn`` refuses the layout.
        WeightsError: keys missing or unexpected (``strict``), or values no trained model holds.

    ``saved_config``: the config saved with the weights (:func:`load_model`), which built the model, so
    nothing is fine-tuned: a class head of another shape means the file and its config disagree, and
    is refused naming the tensors (it used to be re-initialised: an export predicting with a random head).
    """
    if entry is None:
        entry = get_entry(model.model_name)
    where = source or entry.name
    try:
        state = convert_state(model, state, strict=strict, entry=entry)
        if strict:
            _check_settings(model, state)
    except WeightsLayoutError as e:  # the family's own words: the file named once
        if where in str(e):
            raise
        raise WeightsLayoutError(f"{where}: {e}") from e
    except UserError:
        raise
    except ValueError as e:  # the family refusing a layout: the file's fault, named, not a traceback
        raise WeightsLayoutError(f"{where}: {e}") from e
    own = model.state_dict()
    # other shapes outside the heads: named here for models that declare their settings (the DETR family);
    # others may adapt them in a load hook (ViT resamples pos_embed), so load_state_dict judges those
    exact = model.weights_settings is not None or saved_config is not None
    reinitialised, mismatched, dropped = [], [], set()
    for key in list(state):
        mine = own.get(key)
        if mine is None or state[key].shape == mine.shape or not (exact or _is_head_key(model, key)):
            continue
        change = f"{key} {tuple(state[key].shape)} -> {tuple(mine.shape)}"
        (reinitialised if _is_head_key(model, key) and saved_config is None else mismatched).append(change)
        dropped.add(key)
        del state[key]
    if mismatched and saved_config is not None and strict:
        settings = ", ".join(f"{k}={v}" for k, v in (saved_config.get("model_kwargs") or {}).items())
        raise WeightsLayoutError(
            f"{where}: {len(mismatched)} tensor(s) have another shape than in {entry.name} built from the config saved "
            f"with them ({settings or 'its defaults'}) (file -> model): {'; '.join(mismatched[:6])}. The weights and their "
            "config disagree (a file replaced or a .json from another export): export the model again with tools/export.py, "
            f"or fine-tune from the weights with create_model({entry.name!r}, pretrained=...)"
        )
    if mismatched:
        if strict:
            raise WeightsLayoutError(
                f"{where}: {len(mismatched)} tensors of the weights have another shape than in {entry.name} as built "
                f"(weights -> model): {'; '.join(mismatched[:6])}. Only the class-dependent tensors "
                f"({', '.join(model.head_prefixes)}) may differ (fine-tuning to other classes): build the model with the "
                "weights' settings, or pass strict=False to load what fits."
            )
        log.warning("%s: %d tensors not loaded because their shapes differ (strict=False): %s", where, len(mismatched),
                    "; ".join(mismatched))
    check_tensor_values(state, model, where)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:
        # a shape no load hook adapted (a model without weights_settings): weights of another variant or family
        other = [key for key in own if key in state and state[key].shape != own[key].shape]  # in the model's order
        shapes = "; ".join(f"{k} {tuple(state[k].shape)} -> {tuple(own[k].shape)}" for k in other[:6])
        if strict or not other:
            raise WeightsLayoutError(
                f"{where}: {len(other)} tensor(s) of the weights have another shape than in {entry.name} as built "
                f"(weights -> model): {shapes or str(e).strip().splitlines()[-1]}. They are of another variant or family: "
                "build the model they were trained as (its name and settings), or pass strict=False to load what fits"
            ) from e
        log.warning("%s: %d tensors not loaded because their shapes differ (strict=False): %s", where, len(other), shapes)
        for key in other:
            del state[key]
        missing, unexpected = model.load_state_dict(state, strict=False)
    head_missing = [k for k in missing if _is_head_key(model, k)] if saved_config is None else []
    real_missing = [k for k in missing if k not in head_missing]
    if strict and (real_missing or unexpected):
        raise WeightsError(
            f"{where}: weights do not fit {entry.name}: {key_mismatch(real_missing, unexpected)}; they are of another "
            f"model or layout: load them with the model they were saved from (in Python, create_model({entry.name!r}, "
            "pretrained=..., strict=False) loads what fits)"
        )
    reinitialised += [f"{k} (not in the weights) -> {tuple(own[k].shape)}" for k in head_missing if k not in dropped]
    if reinitialised:
        # one line, as timm's and torchvision's num_classes handling: what starts from scratch
        rest = "every other tensor loaded unchanged" if not (mismatched or real_missing) else "strict=False: not all others loaded"
        log.warning(
            "%s: class head not loaded because the number of classes differs (fine-tuning): %s (%d class-dependent tensors "
            "re-initialised, %s)", where, "; ".join(reinitialised), len(reinitialised), rest,
        )
    log.info("loaded %d tensors from %s (%d head tensors left at init)", len(state), source or "weights", len(head_missing))


def key_mismatch(missing: list[str], unexpected: list[str]) -> str:
    """``missing N keys (e.g. ...)`` and/or ``unexpected M keys (e.g. ...)``: only what is wrong."""
    parts = [f"{what} {len(keys)} key{'s' if len(keys) > 1 else ''} (e.g. {', '.join(keys[:5])})"
             for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
    return ", ".join(parts)


def _check_settings(model: nn.Module, state: dict) -> None:
    """Refuse weights of another architecture by the setting that differs, not by a tensor's shape.

    A model may define ``weights_settings(state) -> {setting: value}`` (read from tensors in its
    own names); the weights' values are compared with those of the model's own state dict.
    """
    if model.weights_settings is None:
        return
    problem = describe_differences(model.weights_settings(state), model.weights_settings(model.state_dict()),
                                   section=getattr(model, "weights_settings_section", None))
    if problem:
        raise ValueError(problem)


def convert_state(model: nn.Module, state: dict, strict: bool = True, entry: ModelEntry | None = None) -> dict:
    """``state`` through the registry's ``filter_fn`` of ``model`` (foreign or former layouts -> its names).

    Raises what the ``filter_fn`` raises, e.g. :class:`WeightsLayoutError` for a layout that ``model``
    cannot take exactly (with ``strict=False`` a filter that supports it keeps what fits instead).
    """
    entry = entry or get_entry(model.model_name)
    fn = entry.filter_fn
    if fn is None:
        return state
    if "strict" in inspect.signature(fn).parameters:
        return fn(state, model, strict=strict)
    return fn(state, model)


def describe_differences(found: Mapping[str, int], built: Mapping[str, int], section: str | None = None) -> str | None:
    """None when every setting both sides show agrees; else a message naming each difference and the fix, spelt in
    the config ``section`` that holds the settings (``arch``: ``create_model(..., arch={...})``), or as top-level
    keywords without one."""
    differ = [name for name in found if name in built and found[name] != built[name]]
    if not differ:
        return None
    weights = ", ".join(f"{n}={found[n]}" for n in differ)
    model = ", ".join(f"{n}={built[n]}" for n in differ)
    kwargs = ", ".join(f"{n}: {found[n]}" for n in differ)
    if section:
        python = f"{section}={{{', '.join(f'{n!r}: {found[n]}' for n in differ)}}}"
        kwargs = f"{section}: {{{kwargs}}}"
    else:
        python = weights
    return (
        f"the weights were trained with {weights}, but the model is built with {model}. Only the class-dependent "
        f"tensors may differ when fine-tuning (the number of classes); build the model with the weights' settings: "
        f"create_model(..., {python}), or in a config model_kwargs: {{{kwargs}}}"
    )


def _is_head_key(model: nn.Module, key: str) -> bool:
    """Whether ``key`` is a class-dependent tensor (its shape follows ``num_classes``, timm's ``head``)."""
    return key.startswith(model.head_prefixes)


def check_settings_fit_the_weights(name: str, kwargs: Mapping[str, Any], held: int, where: str) -> None:
    """Refuse saved settings that build a model far larger than the weights saved with them, before it is allocated.

    A file's settings build the model its weights then fill; a small file whose settings ask for a model of
    billions of values (``embed_dim: 8192`` beside a tiny ViT's tensors) took gigabytes before the weights were
    compared. The model is built on the meta device first; it may exceed ``held`` (the file's tensor values) by four
    times and 50 million values (200 MB of float32: parts a file need not hold, and below that the weights' own
    comparison names the tensors that differ), not more."""
    network = {k: v for k, v in kwargs.items() if k not in ("pretrained", "strict", "features_only", *FEATURE_KWARGS)}
    with warnings.catch_warnings():  # a former spelling warns once, when the model itself is built
        warnings.simplefilter("ignore")
        meta = check_model_arguments(name, **network)
    needed = sum(t.numel() for t in meta.state_dict().values())
    if needed > 4 * held + 50_000_000:
        raise WeightsError(f"{where}: its saved settings build {name} with {needed:,} values, but the file holds {held:,}: "
                           "the settings and the weights are not of one model, and the model is not built; export the "
                           "model again with tools/export.py, or build it yourself with create_model(...)")


def load_model(path: str | Path, **overrides: Any) -> nn.Module:
    """Rebuild a model saved by :func:`visiontf.save_model` (config stored with the weights).

    ``overrides`` go to :func:`create_model` (``strict=False`` among them).
    """
    config = read_config(path)
    if config is None:
        raise WeightsError(
            f"{path}: no visiontf config in the file's metadata nor a .json beside it, so the model it holds is "
            "unknown; export a checkpoint with tools/export.py (it stores the config), or in Python use "
            "create_model(name, pretrained=path) and name the model yourself"
        )
    saved = config.get("model_kwargs", {})
    if "strict" in saved:  # how to load is the caller's choice: a file may not switch off the check of its own tensors
        raise WeightsError(f"{path}: its config's model_kwargs.strict is {saved['strict']!r}, an option of loading, not of the "
                           "model; export the model again with tools/export.py, or pass load_model(path, strict=False)")
    kwargs = {**saved, **overrides}
    strict = kwargs.pop("strict", True)
    state = load_state_dict_file(path)
    try:
        check_settings_fit_the_weights(config["model_name"], kwargs, sum(t.numel() for t in state.values()), str(path))
        # the weights are the file's own: a weight file its config names (a backbone's pretrained) is not read
        with weights_from_checkpoint():
            model = create_model(config["model_name"], **kwargs)
    except WeightsError:
        raise  # names the file already
    except UserError as e:  # the registry's own words (an unknown name, a misspelt keyword), with the file named
        message = f"{path}: its saved config: {e}"
        try:
            named = type(e)(message)
        except Exception:  # noqa: BLE001 - an error class built from more than a message
            named = WeightsError(message)
        raise named from None
    except (TypeError, ValueError) as e:  # a value of the wrong kind deep in a constructor (num_classes: "x")
        raise WeightsError(f"{path}: its saved config ({config['model_name']}, model_kwargs {short_repr(saved)}) does not "
                           f"build a model ({type(e).__name__}: {e}); export the model again with tools/export.py") from None
    # the model is built from the file's own config: every tensor must fit, class heads included
    load_pretrained(model, state, get_entry(config["model_name"]), strict=strict, source=str(path), saved_config=config)
    return model


def torch_hub_state_dict(url: str, name: str) -> Callable[[], dict]:
    """A fetcher that downloads through torch hub's own code, with a clear error offline."""

    def fetch() -> dict:
        from visiontf.io.downloads import DownloadError, check_torch_hub_download

        fix = f"Without network, download the file elsewhere and pass pretrained='/path/to/{Path(url).name}'."
        check_torch_hub_download(url, f"{name} weights", fix)  # offline: at once, not after the socket's timeout
        try:
            state = torch.hub.load_state_dict_from_url(url, map_location="cpu", weights_only=True, check_hash=False)
        except Exception as e:
            raise DownloadError(
                f"could not download {name} weights from {url} ({type(e).__name__}: {e}). {fix}"
            ) from e
        return state.get("model", state) if isinstance(state, dict) else state

    return fetch
