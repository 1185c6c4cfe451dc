"""Lightning's checkpoint plugin for visiontf: atomic local writes and loads that name the file.

Lightning's own writer (``fsspec`` transactions) writes the temporary file under ``$TMPDIR`` and
*copies* it across when the run folder is on another filesystem, so a kill during that copy leaves a
truncated ``last.ckpt``, and a full disk leaves a partial one. :class:`AtomicCheckpointIO` writes
local checkpoints with :func:`visiontf.io.atomic_write.atomic_save` (temporary file beside the
destination, fsync, ``os.replace``) and reports unreadable ones as "corrupt or incomplete (N
bytes)" with the file's name. ``tools/train.py`` installs it (:func:`install_atomic_checkpoint_io`);
remote URLs keep Lightning's writer.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol

from visiontf.core.saved_arguments import short_repr
from visiontf.io.atomic_write import atomic_save, remove_stale_temporaries
from visiontf.io.lightning_checkpoint import check_callback_paths
from visiontf.io.weights import WeightsError, describe_load_failure, safe_torch_load

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning ``CheckpointIO`` that writes local checkpoints with :func:`atomic_save` and names the
    file (and says "corrupt or incomplete") when a checkpoint cannot be read."""

    def __init__(self) -> None:
        super().__init__()
        self._folders_seen: set[Path] = set()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(str(path)):
            return super().save_checkpoint(checkpoint, path, storage_options)
        folder = Path(str(path)).resolve().parent
        if folder not in self._folders_seen:
            # this process has written nothing here yet, so every temporary file in the folder is a killed
            # run's (a best checkpoint's name is never written again: atomic_save alone would keep it forever)
            remove_stale_temporaries(path, every_name=True)
            self._folders_seen.add(folder)
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any = lambda storage, loc: storage, weights_only: bool | None = None
                        ) -> dict[str, Any]:
        if weights_only is False:
            # Lightning's fit/validate take weights_only (a config key and an option of tools/train.py), and False
            # would unpickle whatever the file holds: a checkpoint is data, so it is never read that way
            raise WeightsError(f"{path}: weights_only false asks to unpickle the checkpoint as code; visiontf reads every "
                               "checkpoint as data (weights only): drop weights_only from the config or the command")
        try:
            if _is_local_file_protocol(str(path)):
                checkpoint = safe_torch_load(str(path), map_location=map_location)
            else:
                checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=True)
        except WeightsError:
            raise
        except Exception as e:
            error = describe_load_failure(Path(str(path)), e) if _is_local_file_protocol(str(path)) else None
            if error is None:
                raise
            raise error from e
        _check_lightning_version(checkpoint, path)
        check_callback_paths(checkpoint, path)
        return checkpoint


def _check_lightning_version(checkpoint: Any, path: Any) -> None:
    """Lightning reads the version a checkpoint records to migrate it, and fails with a bare parse error on one that
    is not a version: named here with the file."""
    from packaging.version import InvalidVersion, Version

    version = checkpoint.get("pytorch-lightning_version") if isinstance(checkpoint, dict) else None
    if version is None:
        return
    try:
        Version(version if isinstance(version, str) else "")
    except InvalidVersion:
        raise WeightsError(f"{path}: pytorch-lightning_version is {short_repr(version)}, not a version; the file was not "
                           "written by Lightning (or was edited): use a checkpoint written by visiontf's tools/train.py") from None


def install_atomic_checkpoint_io(trainer: Any) -> bool:
    """Give ``trainer``'s strategy an :class:`AtomicCheckpointIO` unless it has a custom ``CheckpointIO``.

    Returns whether it was installed (a plugin the user configured is left alone, with a log line).
    """
    strategy = trainer.strategy
    current = strategy.checkpoint_io
    if isinstance(current, AtomicCheckpointIO):
        return True
    if type(current) is not TorchCheckpointIO:
        log.info("keeping the configured checkpoint plugin %s (visiontf's atomic writer not installed)",
                 type(current).__name__)
        return False
    strategy.checkpoint_io = AtomicCheckpointIO()
    return True


__all__ = ["AtomicCheckpointIO", "atomic_save", "install_atomic_checkpoint_io", "remove_stale_temporaries"]
