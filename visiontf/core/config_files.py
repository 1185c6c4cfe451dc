"""Training YAMLs that build on others: a variant names its base file(s) and states only what differs.

A config may name the files it builds on under ``base_config:``, a path (or a list of paths) relative to the
config's own folder::

    # configs/rtdetr/rtdetr_r34vd_6x_coco.yaml
    base_config: _base/rtdetr_coco.yaml
    trainer:
      default_root_dir: outputs/rtdetr_r34vd_6x_coco
    model:
      init_args:
        model_name: rtdetr_r34vd

The tools read ``--config V`` as ``--config B --config V`` (:func:`config_chain`; a base may name bases of its
own, composed first): jsonargparse composes the files in that order, each over the ones before, mapping by
mapping: a group or ``init_args`` key the variant leaves out keeps the base's value. A list of option groups
(``param_groups``) merges item by item by position there, so a base should leave such lists to its variants
(the shipped bases do; ``tests/integration/test_cli.py`` checks each shipped variant against :func:`read_config`,
which replaces lists). The parser takes ``base_config`` as a hidden option that does nothing
itself (``visiontf.cli.train``), so a printed or saved config (``--print_config``, a run's ``config.yaml``) has
every value and no ``base_config``.

Not jsonargparse's own ``config:`` key in a file: that one lets the base override the keys before it, and a
``model`` given in part after it loses its ``class_path``.

:func:`read_config` is the composed file as plain data, for the readers that take a YAML without the parser
(the data section of ``tools/predict.py --config``, the run folder of ``--ckpt_path last``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from visiontf.core.config_checks import ConfigError
from visiontf.core.saved_arguments import expands_beyond

#: the key of a config that names the files it builds on
BASE_KEY = "base_config"


def _load(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: a YAML {type(loaded).__name__}, not a mapping of sections (trainer, model, data)")
    if expands_beyond(loaded):
        # the readers copy the values out (jsonargparse, json.dumps), and a few hundred bytes of anchors and aliases
        # stand for billions
        raise ConfigError(f"{path}: its anchors and aliases expand into more values than any training config holds; "
                          "write the values out")
    return loaded


def base_files(path: str | Path) -> list[Path]:
    """The files ``path``'s ``base_config:`` key names, resolved against ``path``'s folder (none without the key)."""
    path = Path(path)
    cfg = _load(path)
    if BASE_KEY not in cfg:
        return []
    names = cfg[BASE_KEY]
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{path}: '{BASE_KEY}:' takes a path or a list of paths of YAML files (relative to "
                          f"{path.parent}), got {cfg[BASE_KEY]!r}")
    found = []
    for name in names:
        base = Path(name) if Path(name).is_absolute() else path.parent / name
        if not base.is_file():
            raise ConfigError(f"{path}: {BASE_KEY}: {name}: no such file ({base}); paths are relative to the "
                              f"config's folder {path.parent}")
        found.append(base)
    return found


def config_chain(path: str | Path, _seen: tuple[Path, ...] = ()) -> list[Path]:
    """The files to compose for ``--config path``, in order: its bases' chains (depth first), then ``path``."""
    path = Path(path)
    key = path.resolve()
    if key in _seen:
        cycle = " -> ".join(str(p) for p in (*_seen, key))
        raise ConfigError(f"{path}: its '{BASE_KEY}:' bases lead back to itself ({cycle}); remove one of them")
    chain: list[Path] = []
    for base in base_files(path):
        for file in config_chain(base, (*_seen, key)):
            if file not in chain:
                chain.append(file)
    return [*chain, path]


def merge_config_data(base: Any, over: Any) -> Any:
    """``over`` on top of ``base`` as a config file's base composes with it: mappings merged key by key, anything else
    (lists included) replaced; a mapping naming another ``class_path`` replaces the base's whole."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    if "class_path" in over and over["class_path"] != base.get("class_path"):
        return over  # another class: the base's arguments are not its arguments
    merged = dict(base)
    for key, value in over.items():
        merged[key] = merge_config_data(base[key], value) if key in base else value
    return merged


def read_config(path: str | Path) -> dict[str, Any]:
    """``path`` composed with its bases as plain data (mappings merged key by key, lists replaced), without
    the ``base_config`` key. What the parser would add (defaults, types) is not here, and a list of option groups
    that both a base and its variant give would differ (the parser merges its items)."""
    merged: dict[str, Any] = {}
    for file in config_chain(path):
        cfg = {k: v for k, v in _load(file).items() if k != BASE_KEY}
        merged = merge_config_data(merged, cfg)
    return merged


__all__ = ["BASE_KEY", "base_files", "config_chain", "merge_config_data", "read_config"]
