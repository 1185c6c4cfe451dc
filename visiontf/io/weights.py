"""Reading and writing weight files safely.

User files are never unpickled blindly: ``.safetensors`` is read with safetensors and any other
file with ``torch.load(..., weights_only=True)``, which refuses arbitrary Python objects.
"""
from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import logging
import pathlib
import pickle
import typing
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from visiontf.core.errors import UserError

log = logging.getLogger(__name__)

#: keys naming weight files that start a training run (a backbone's ``pretrained``, timm's ``checkpoint_path``)
WEIGHT_FILE_KEYS = frozenset({"pretrained", "checkpoint_path"})
#: a task's ``model_kwargs`` that name weight files read only to start training (a checkpoint holds every weight)
INIT_ONLY_KWARGS = ("backbone_pretrained", "encoder_pretrained", "pretrained")

_restoring: contextvars.ContextVar[bool] = contextvars.ContextVar("weights_from_checkpoint", default=False)


@contextlib.contextmanager
def weights_from_checkpoint() -> Iterator[None]:
    """Within it, models are built for a checkpoint whose state dict then replaces every weight (a run resumed or
    evaluated with ``--ckpt_path``, a task's ``load_from_checkpoint``, a checkpoint's or an export's network):
    ``create_model`` reads none of the weight files their settings name to start training from (the whole model's
    ``pretrained``, a backbone's, :data:`WEIGHT_FILE_KEYS` at any depth, :data:`INIT_ONLY_KWARGS`). So the
    checkpoint alone is needed: the file a run was fine-tuned from may have moved, or be on another machine."""
    token = _restoring.set(True)
    try:
        yield
    finally:
        _restoring.reset(token)


def restoring_weights() -> bool:
    """Whether the models built now get their weights from a checkpoint afterwards (:func:`weights_from_checkpoint`)."""
    return _restoring.get()


#: keys under which common training frameworks nest the state dict inside a checkpoint
_NESTED_KEYS = ("model", "state_dict", "model_state_dict", "module", "model_ema", "ema")


class WeightsError(UserError, RuntimeError):
    """A weight file could not be read or does not fit the model."""


#: the classes beyond tensors and plain data that a checkpoint may hold, all plain attribute data:
#: the original DETR pickles its argparse Namespace ("args"); Lightning stores data-module
#: hyper-parameters as given, which may be pathlib paths
SAFE_GLOBALS = (argparse.Namespace, pathlib.PurePosixPath, pathlib.PureWindowsPath)
#: the path classes by the names a pickle gives them: Python 3.13 moved them to ``pathlib._local``, and a concrete path
#: of the other system (a checkpoint written on Windows, read on Linux) cannot be built here, so it is read as the
#: pure path of its kind
_READ_AS = {"PosixPath": pathlib.PurePosixPath, "WindowsPath": pathlib.PureWindowsPath,
            "PurePosixPath": pathlib.PurePosixPath, "PureWindowsPath": pathlib.PureWindowsPath}
_READ_AS[type(pathlib.Path()).__name__] = type(pathlib.Path())  # this system's own concrete paths stay concrete
PATH_GLOBALS = tuple((cls, f"{module}.{name}") for name, cls in _READ_AS.items() for module in ("pathlib", "pathlib._local")
                     if f"{module}.{name}" not in ("pathlib.PurePosixPath", "pathlib.PureWindowsPath"))  # in SAFE_GLOBALS

#: Lightning < 1.5 keyed ``checkpoint["callbacks"]`` by the callback's class (taming-transformers' and
#: latent-diffusion's published ``.ckpt`` files): each name unpickles as an inert stand-in class of
#: its own, so nothing of Lightning is imported or run and the callback states stay plain data
LEGACY_LIGHTNING_CALLBACKS = tuple(
    (type(name.rsplit(".", 1)[1], (), {"__doc__": f"stand-in for {name} as a checkpoint key"}), name)
    for name in ("pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
                 "pytorch_lightning.callbacks.early_stopping.EarlyStopping")
)


def allow_listed_globals() -> contextlib.AbstractContextManager:
    """A context in which every ``torch.load(weights_only=True)`` takes the allow-list of :func:`safe_torch_load`
    (what ``tools/train.py`` wraps its run in, so that the loads Lightning makes itself read what visiontf reads)."""
    return torch.serialization.safe_globals([*SAFE_GLOBALS, *PATH_GLOBALS, *LEGACY_LIGHTNING_CALLBACKS])


def safe_torch_load(path: str | Path | typing.IO[bytes], map_location: Any = "cpu", mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` allowing only :data:`SAFE_GLOBALS` beyond tensors (and the
    stand-ins of :data:`LEGACY_LIGHTNING_CALLBACKS`).

    The one reader of ``.pth``/``.pt``/``.ckpt`` files in visiontf (weight files and Lightning
    checkpoints alike). Refused, truncated and corrupt files raise :class:`WeightsError` naming the
    file and the fix (:func:`describe_load_failure`). ``mmap``: map a zip archive's tensors instead of
    reading them, and skip the CRC check that reads the whole file, for a look at a checkpoint's
    small entries (its task, its hyper-parameters) before the full load.
    """
    if not isinstance(path, (str, Path)):  # an open binary file (Lightning's load_from_checkpoint takes one)
        with allow_listed_globals():
            loaded = torch.load(path, map_location=map_location, weights_only=True)
        check_tensor_memory(loaded, getattr(path, "name", "the file"))
        return loaded
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: file not found" + (" (a broken symbolic link)" if path.is_symlink() else ""))
    packed = compressed_record(path)
    if packed:
        raise WeightsError(
            f"{path}: record {packed!r} of the archive is compressed; torch.save stores every record uncompressed, and a "
            "compressed one can unpack into far more memory than the file holds, so the file is refused unread: save "
            "the weights again with torch.save (or export them with tools/export.py)")
    damaged = None if mmap else damaged_record(path)
    if damaged:
        raise corrupt_file_error(path, damaged)
    try:
        with allow_listed_globals():
            loaded = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except Exception as e:
        raise (describe_load_failure(path, e) or e) from e
    check_tensor_memory(loaded, path)
    return loaded


def _tensors(obj: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a loaded object, with where it is (each container visited once: the pickle may reference one
    many times, and nest deeper than Python recursion goes)."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        where, item = stack.pop()
        if torch.is_tensor(item):
            yield where, item
            continue
        if id(item) in seen or isinstance(item, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(item))
        if isinstance(item, Mapping):
            stack.extend((f"{where}[{k!r}]", v) for k, v in item.items())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            stack.extend((f"{where}.{k}", v) for k, v in vars(item).items())


def bytes_held(t: torch.Tensor) -> int | None:
    """The bytes of memory a strided tensor's storage holds from its first element on (None for tensors without one:
    sparse, meta or empty); fewer than ``numel * element_size`` means its elements share memory."""
    if t.layout != torch.strided or t.numel() == 0 or t.device.type == "meta":
        return None
    return t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()


def short_of_memory(t: torch.Tensor) -> int | None:
    """The bytes ``t``'s storage holds (at least 0) when they are fewer than its values claim (a view with a zero
    stride, whose elements share memory); None for a tensor with memory for each of its values."""
    held = bytes_held(t)
    return max(held, 0) if held is not None and held < t.numel() * t.element_size() else None


def check_tensor_memory(obj: Any, path: str | Path) -> None:
    """Refuse a loaded file whose tensors claim more elements than their memory holds.

    ``torch.save`` writes each tensor with its storage, and a view of a storage may repeat its elements (a zero
    stride: ``torch.zeros(1).expand(4096, 4096)``), so a few bytes in a file can stand for any number of values. Code
    that takes a tensor for dense memory then reads or writes past it (torch's fused AdamW did, resuming such an
    optimizer state: the process died), and anything that reads every value (a NaN check, ``.contiguous()``) allocates
    what the file claims. Only the tensors' sizes are read, never their data.

    Raises:
        WeightsError: naming the file and where the tensor is.
    """
    for where, t in _tensors(obj):
        held = short_of_memory(t)
        if held is not None:
            raise WeightsError(f"{path}: the tensor at {where or 'the top'} (shape {tuple(t.shape)}, strides {t.stride()}) "
                               f"claims {t.numel() * t.element_size()} bytes of values but holds {held}: its "
                               "elements share memory with one another (a view with a zero stride), where a model's "
                               "weights and a run's training state each hold their own; the file is refused: save the "
                               "tensor with .contiguous() if it is yours")


def describe_load_failure(path: Path, error: BaseException) -> WeightsError | None:
    """The :class:`WeightsError` that explains why ``torch.load`` failed on ``path``, or None when the
    failure is not about the file (then the original error stands).

    Two cases: the weights-only unpickler refused a Python object (a pickle that is not plain data),
    or the file is not a complete torch archive: cut off while being written (a killed run, a full
    disk, an interrupted copy) or damaged. The second message says "corrupt or incomplete (N bytes)".
    """
    if isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error):
        # torch's own text is advice about weights_only=False (never taken here) around the one line that names
        # what was refused ("Unsupported global: GLOBAL posix.system ...", "unsupported GLOBAL ...", an opcode)
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        named = [line for line in lines if "unsupported" in line.lower() or "GLOBAL" in line or "WeightsUnpickler" in line]
        first = (named or lines[-1:] or ["refused"])[0].removeprefix("WeightsUnpickler error: ").split(". Please")[0][:300]
        return WeightsError(
            f"{path}: refused to load with weights_only=True ({first}). "
            "The file holds Python objects beyond tensors; visiontf never unpickles them. "
            "Re-save it as a plain state dict or convert it to .safetensors (for a checkpoint, export the "
            "model with tools/export.py from a trusted environment)."
        )
    if not path.is_file():
        return None
    text = str(error)
    corrupt = (
        isinstance(error, (EOFError, pickle.UnpicklingError, zipfile.BadZipFile))
        or (isinstance(error, RuntimeError) and any(s in text for s in _CORRUPT_MARKERS))
        or not is_complete_torch_file(path)
    )
    if not corrupt:
        return None
    return corrupt_file_error(path, text.strip().splitlines()[0][:160] if text.strip() else type(error).__name__)


def corrupt_file_error(path: Path, reason: str) -> WeightsError:
    """The "corrupt or incomplete (N bytes)" error of ``path``."""
    size = path.stat().st_size if path.is_file() else 0
    return WeightsError(
        f"{path}: corrupt or incomplete ({size:,} bytes): not a complete PyTorch file ({reason}). It was probably "
        "cut off while being written (a killed run, a full disk, an interrupted copy) or damaged; use another "
        "checkpoint (the run's best one, or an earlier copy) or copy the file again."
    )


def compressed_record(path: Path) -> str | None:
    """The first record of the zip archive ``path`` that is compressed, or None (``torch.save`` stores every record;
    torch.load reads compressed ones too, so a small file could unpack into gigabytes)."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as z:
            return next((info.filename for info in z.infolist() if info.compress_type != zipfile.ZIP_STORED), None)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None  # damaged: damaged_record and torch.load name it


def damaged_record(path: Path) -> str | None:
    """Why the zip archive ``torch.save`` wrote is damaged (a missing directory, a record whose CRC-32
    does not match), or None. torch.load itself does not check the CRCs, so a flipped block would
    load as wrong weights; checking reads the file once more (cheap beside the load itself; docs/record/speed.md#measurements-behind-comments-in-the-code).
    Files in torch's legacy (non-zip) format are not checked here."""
    if not zipfile.is_zipfile(path):
        return None if is_complete_torch_file(path) else "the archive ends early or has no directory"
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"unreadable archive: {e}"
    return f"record {bad!r} does not match its CRC-32" if bad else None


#: torch's messages for archives that are cut off or damaged
_CORRUPT_MARKERS = ("PytorchStreamReader", "central directory", "unexpected EOF", "invalid header", "legacy .tar format",
                    "file might be corrupted", "Invalid magic number", "invalid load key",
                    # a record whose bytes disagree with the sizes, shapes or strides its pickle declares for it
                    "does not match expected size", "storage that is not resizable", "Storage size calculation overflowed")


def is_complete_torch_file(path: Path) -> bool:
    """Whether ``path`` is a readable zip archive (what ``torch.save`` writes) or at least a pickle."""
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                return bool(z.namelist())
        except (zipfile.BadZipFile, OSError):
            return False
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"  # a pickle protocol >= 2 header: the legacy torch.save format


def read_safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a ``.safetensors`` file (where :func:`save_model` keeps the config)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except SafetensorError as e:
        raise not_safetensors_error(Path(path), e) from e


def not_safetensors_error(path: Path, error: BaseException) -> WeightsError:
    """safetensors' own error ("header too large") names neither the file nor what it really is: most
    often a ``torch.save`` pickle given a ``.safetensors`` name, or a file cut off while copied."""
    with open(path, "rb") as f:
        head = f.read(2)
    if head[:1] == b"\x80" or head == b"PK":
        return WeightsError(
            f"{path}: a PyTorch pickle (what torch.save writes), not a safetensors file, although it is named .safetensors; "
            f"rename it to {path.with_suffix('.pth').name} (visiontf reads .pth files with weights_only=True: tensors "
            "only, never code) or convert it with safetensors.torch.save_file")
    return WeightsError(f"{path}: not a readable safetensors file ({error}); it may be cut off or damaged: copy it again, "
                        "or export the model again with tools/export.py")


#: the floating dtypes weights may come in (cast to the model's on load); float8 and other quantised formats are refused
LOADABLE_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def not_a_tensor(source: str, key: str, value: object) -> WeightsError:
    """The error of a state dict's entry that is no tensor (a string, a list: no trained model's weight)."""
    return WeightsError(f"{source}: {key!r} is a {type(value).__name__}, where the model holds a tensor; these are not a "
                        "model's trained weights (re-export them from the training checkpoint)")


def check_tensor_values(state: dict[str, torch.Tensor], model: torch.nn.Module, source: str) -> None:
    """Refuse weights that ``load_state_dict`` would take silently but that cannot be a trained model's:
    an integer or boolean tensor where the model holds floats (cast without a word: every score
    became the same), or NaN/infinite values (a diverged run). Names the tensor and the file."""
    own = model.state_dict()
    for key, value in state.items():
        mine = own.get(key)
        if mine is None:
            continue
        if not torch.is_tensor(value):
            raise not_a_tensor(source, key, value)
        if value.is_meta or value.layout != torch.strided:
            raise WeightsError(f"{source}: tensor {key!r} is {'a meta tensor, without values' if value.is_meta else value.layout}, "
                               "where the model holds a dense tensor; these are not a model's trained weights (re-export "
                               "them from the training checkpoint)")
        if mine.is_floating_point() and not value.is_floating_point():
            raise WeightsError(f"{source}: tensor {key!r} is {value.dtype} where the model holds {mine.dtype}; these are not "
                               "a model's trained weights (re-export them from the training checkpoint)")
        if value.is_floating_point() and value.dtype not in LOADABLE_FLOATS:
            raise WeightsError(f"{source}: tensor {key!r} is {value.dtype}, a quantised format visiontf does not load (it "
                               f"loads {', '.join(str(d).removeprefix('torch.') for d in LOADABLE_FLOATS)}); dequantise the "
                               "weights to float32 first, or re-export them from the training checkpoint")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise WeightsError(f"{source}: tensor {key!r} has {bad} NaN/infinite value(s) of {value.numel()}; the run that "
                               "wrote it diverged (take an earlier checkpoint)")


def load_state_dict_file(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Load a state dict from ``.safetensors`` or a ``.pth/.pt/.bin/.ckpt`` file.

    Nested checkpoints (``{"model": ...}`` as saved by the original DETR, ``{"state_dict": ...}``
    as saved by Lightning) are unwrapped. From a Lightning ``.ckpt``, the tensors under ``model.``
    (a visiontf task's network) are kept, without the prefix.
    """
    return read_weights_file(path, map_location).state


@dataclass(frozen=True)
class WeightsFile:
    """A weight file's tensors (:func:`load_state_dict_file`'s state dict) and, where the file says which model they
    were saved from, that model's config: ``{"model_name": ..., "model_kwargs": ...}`` of a visiontf task checkpoint's
    ``hyper_parameters`` or of an export's metadata (:func:`read_config`), checked as plain data; else None."""

    state: dict[str, torch.Tensor]
    saved_config: dict[str, Any] | None


def read_weights_file(path: str | Path, map_location: str | torch.device = "cpu") -> WeightsFile:
    """The tensors of ``path`` (as :func:`load_state_dict_file`) and the config of the model they were saved from,
    read in the same pass. A config that is not plain data is no config here (the tensors are what is asked for)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            state = load_file(str(path), device=str(map_location))
        except SafetensorError as e:
            raise not_safetensors_error(path, e) from e
        try:
            config = read_config(path)
        except WeightsError as e:
            log.debug("%s: its saved config is not read (%s)", path, e)
            config = None
        return WeightsFile(state, config)
    obj = safe_torch_load(path, map_location)
    return WeightsFile(_unwrap(obj, path), _task_config(obj, path) if _looks_lightning(path) else None)


def _task_config(ckpt: Any, path: Path) -> dict[str, Any] | None:
    """A visiontf task checkpoint's ``model_name`` and ``model_kwargs``, or None (another framework's checkpoint, or
    values that are not plain data)."""
    from visiontf.core.saved_arguments import SavedArgumentsError, check_value

    hp = ckpt.get("hyper_parameters") if isinstance(ckpt, Mapping) else None
    if not isinstance(hp, Mapping) or not isinstance(hp.get("model_name"), str):
        return None
    try:
        kwargs = check_value(hp.get("model_kwargs") or {}, dict[str, Any], str(path), "hyper_parameters.model_kwargs")
    except SavedArgumentsError as e:
        log.debug("%s: its saved model_kwargs are not read (%s)", path, e)
        return None
    return {"model_name": hp["model_name"], "model_kwargs": dict(kwargs)}


def _unwrap(obj: Any, path: Path) -> dict[str, torch.Tensor]:
    for _ in range(3):
        if isinstance(obj, Mapping) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            break
        if isinstance(obj, Mapping):
            for key in _NESTED_KEYS:
                if key in obj and isinstance(obj[key], Mapping):
                    obj = obj[key]
                    break
            else:
                raise WeightsError(
                    f"{path}: no state dict found; top-level keys are {sorted(map(str, obj))[:10]}. "
                    f"Expected tensors, or one of {_NESTED_KEYS} holding them."
                )
        else:
            raise WeightsError(f"{path}: expected a mapping of tensors, got {type(obj).__name__}")
    state = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if state and _looks_lightning(path):
        # a visiontf task checkpoint: the network is under "model.", beside the task's own tensors
        # (the criterion's class weights, ...), which are not the network's
        network = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
        if network:
            state = network
    return state


def _looks_lightning(path: Path) -> bool:
    return path.suffix == ".ckpt"


#: the ONNX metadata key under which an export names the :func:`weights_fingerprint` of the weights it was made from
ONNX_WEIGHTS_KEY = "visiontf_weights_sha256"


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 of ``model``'s state dict (each entry's name, dtype, shape and bytes, in name order): equal for two
    models exactly when their weights are, so an exported file can name the weights it was made from."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def save_model(model: torch.nn.Module, path: str | Path, model_name: str | None = None, **model_kwargs: Any) -> Path:
    """Write ``model``'s weights to ``.safetensors`` with the config ``create_model`` needs.

    The file's metadata holds ``model_name`` and ``model_kwargs`` (JSON), so
    ``visiontf.load_model(path)`` rebuilds the model and ``create_model(name, pretrained=path)``
    loads it. A ``<path>.json`` copy of the config is written beside it for humans.
    """
    from safetensors.torch import save_file

    path = Path(path)
    if path.suffix != ".safetensors":
        path = path.with_suffix(".safetensors")
    model_name = model_name or model.model_name
    if model_name is None:
        raise ValueError("model_name is needed: the model was not built by visiontf.create_model")
    kwargs = dict(model.model_kwargs)
    kwargs.update(model_kwargs)
    modules = [k for k, v in kwargs.items() if isinstance(v, torch.nn.Module)]
    if modules:  # an injected part (backbone=MyBackbone()): no config can rebuild it
        raise ValueError(
            f"model_kwargs {modules} hold module instances ({type(kwargs[modules[0]]).__name__}), which a saved config cannot "
            "rebuild; save model.state_dict() with safetensors.torch.save_file and build the model in Python to load it"
        )
    config = {"model_name": model_name, "model_kwargs": kwargs}
    # safetensors refuses shared storage; clone keeps tied weights correct on reload
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata={"visiontf_config": json.dumps(config)})
    path.with_suffix(".json").write_text(json.dumps(config, indent=2) + "\n")
    log.info("saved %d tensors to %s", len(state), path)
    return path


def read_config(path: str | Path) -> dict[str, Any] | None:
    """The visiontf config stored in a ``.safetensors`` file, or in a ``.json`` beside it, checked as plain data
    (``model_name`` a string, ``model_kwargs`` a mapping); None when there is none. A config that is not JSON or
    not such a mapping is a :class:`WeightsError` naming the file and the field."""
    path = Path(path)
    if path.suffix == ".safetensors":
        meta = read_safetensors_metadata(path)
        if "visiontf_config" in meta:
            return _checked_config(meta["visiontf_config"], f"{path}: its metadata's visiontf_config")
    side = path.with_suffix(".json")
    if side.is_file():
        try:
            text = side.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise WeightsError(f"{side}: not a readable JSON file ({e}); export the model again with tools/export.py") from e
        return _checked_config(text, str(side))
    return None


def _checked_config(text: str, where: str) -> dict[str, Any]:
    from visiontf.core.saved_arguments import SavedArgumentsError, check_value

    fix = "export the model again with tools/export.py"
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise WeightsError(f"{where} is not JSON ({e.msg} at line {e.lineno} column {e.colno}); {fix}") from None
    if not isinstance(config, dict):
        raise WeightsError(f"{where} is a JSON {type(config).__name__}, not a mapping with model_name and model_kwargs; {fix}")
    if not isinstance(config.get("model_name"), str):
        raise WeightsError(f"{where} has no model_name string (model_name: {config.get('model_name')!r}); {fix}")
    try:
        config["model_kwargs"] = check_value(config.get("model_kwargs") or {}, dict[str, Any], where, "model_kwargs")
    except SavedArgumentsError as e:
        raise WeightsError(str(e)) from None
    return config


# ---------------------------------------------------------------------------------------- labels files
def labels_path(weights_path: str | Path) -> Path:
    """Where :func:`write_labels_file` keeps class names and preprocessing beside exported weights."""
    p = Path(weights_path)
    return p.with_name(p.stem + ".labels.json")


def write_labels_file(weights_path: str | Path, class_names: Sequence[str] | None = None,
                      label_to_cat_id: Mapping[int, int] | None = None,
                      preprocess: Mapping[str, Any] | None = None) -> Path | None:
    """Write ``<stem>.labels.json`` beside exported weights: class names, category ids and the eval
    preprocessing (``preprocess``: complete, ``pretrained_cfg`` keys)."""
    plain = lambda d: {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}  # noqa: E731
    data: dict[str, Any] = {}
    if class_names:
        data["class_names"] = list(class_names)
    if label_to_cat_id:
        data["label_to_cat_id"] = {str(k): int(v) for k, v in label_to_cat_id.items()}
    if preprocess:
        data["preprocess"] = plain(preprocess)
    if not data:
        return None
    out = labels_path(weights_path)
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out


def read_labels_file(weights_path: str | Path) -> dict[str, Any]:
    """What :func:`write_labels_file` wrote (``{}`` when there is no labels file)."""
    from visiontf.core.saved_arguments import SavedArgumentsError, check_value, label_table

    p = labels_path(weights_path)
    if not p.is_file():
        return {}
    fix = "export the model again with tools/export.py, or delete the file to predict without class names"
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{p}: not a readable JSON file ({e}); {fix}") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{p}: a JSON {type(data).__name__}, not a mapping of class_names, label_to_cat_id and "
                           f"preprocess; {fix}")
    kinds = {"class_names": list[str], "preprocess": dict[str, Any]}
    unknown = sorted(set(data) - {*kinds, "label_to_cat_id"})
    if unknown:
        raise WeightsError(f"{p}: unknown key(s) {unknown}; a labels file holds class_names, label_to_cat_id and "
                           f"preprocess; {fix}")
    try:
        return {k: label_table(v, str(p), k) if k == "label_to_cat_id" else check_value(v, kinds[k], str(p), k)
                for k, v in data.items()}
    except SavedArgumentsError as e:
        raise WeightsError(str(e)) from None
