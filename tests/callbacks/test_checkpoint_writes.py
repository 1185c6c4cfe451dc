"""Checkpoints you can trust: ``last.ckpt`` is the latest state at every save,
writes are atomic in the destination folder, a failed or killed write leaves the previous file and
no partial or temporary file, and a moved run folder resumes onto its own ``last.ckpt``.

Costs: the in-process Lightning runs use a 4-parameter module (under a second each); the kill loop
and the full-tmpfs test start small Python processes (about 15 s together, marked slow).
"""
from __future__ import annotations

import errno
import functools
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from visiontf.callbacks import LastAndBestCheckpoint, ModelEMA
from visiontf.callbacks.checkpoint_io import AtomicCheckpointIO
from visiontf.io.atomic_write import atomic_save

ROOT = Path(__file__).resolve().parents[2]
STEPS_PER_EPOCH = 2


class Tiny(L.LightningModule):
    """A linear model whose validation score gets worse every epoch after the first (``val/score``,
    mode max): the monitored best stays at epoch 0."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        self.log("val/score", -float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4 * STEPS_PER_EPOCH, 2, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def _fit(folder: Path, epochs: int, callback: ModelCheckpoint, ckpt_path: str | None = None, extra: list | None = None,
         **trainer_kwargs) -> L.Trainer:
    trainer = L.Trainer(max_epochs=epochs, callbacks=[callback, *(extra or [])], plugins=[AtomicCheckpointIO()],
                        default_root_dir=folder, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, **trainer_kwargs)
    trainer.fit(Tiny(), _loader(), _loader(), ckpt_path=ckpt_path)
    return trainer


def _step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


class LastSeen(L.Callback):
    """Reads last.ckpt at the start of every epoch (or batch) but the first, and after fit: what a
    process killed at that moment would resume from. (Lightning runs checkpoint callbacks after the
    others within a hook, so reading at the *start* of the next one sees the finished save.)"""

    def __init__(self, folder: Path, every_batch: bool = False) -> None:
        self.folder, self.every_batch, self.seen = folder, every_batch, []

    def _read(self, trainer):
        if trainer.global_step > 0:
            self.seen.append((trainer.global_step, _step(self.folder / "last.ckpt")))

    def on_train_epoch_start(self, trainer, pl_module):
        if not self.every_batch:
            self._read(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.every_batch:
            self._read(trainer)

    def on_train_end(self, trainer, pl_module):
        self._read(trainer)


def test_last_is_the_latest_state_at_every_epoch_although_the_monitor_never_improves(tmp_path):
    ours = LastSeen(tmp_path / "ours")
    cb = LastAndBestCheckpoint(dirpath=tmp_path / "ours", monitor="val/score", mode="max", save_last=True, save_top_k=1)
    _fit(tmp_path, 3, cb, extra=[ours])
    assert ours.seen == [(2, 2), (4, 4), (6, 6)]
    assert Path(cb.best_model_path).name.startswith("epoch=0"), "the best is still the first epoch's"

    # Lightning's ModelCheckpoint: last.ckpt stays at the best (the bug this class fixes)
    plain = ModelCheckpoint(dirpath=tmp_path / "plain", monitor="val/score", mode="max", save_last=True, save_top_k=1)
    _fit(tmp_path, 3, plain)
    assert _step(tmp_path / "plain" / "last.ckpt") == STEPS_PER_EPOCH


def test_last_every_n_steps_and_in_epochs_without_validation(tmp_path):
    """every_n_train_steps=1 with a monitor that exists only after validation (every 2nd epoch)."""
    seen = LastSeen(tmp_path / "ck", every_batch=True)
    cb = LastAndBestCheckpoint(dirpath=tmp_path / "ck", monitor="val/score", mode="max", save_last=True,
                               every_n_train_steps=1)
    _fit(tmp_path, 3, cb, extra=[seen], check_val_every_n_epoch=2)
    assert seen.seen == [(s, s) for s in range(1, 3 * STEPS_PER_EPOCH + 1)]
    # the epoch without validation alone: every_n_train_steps off
    seen = LastSeen(tmp_path / "ck2")
    cb = LastAndBestCheckpoint(dirpath=tmp_path / "ck2", monitor="val/score", mode="max", save_last=True)
    _fit(tmp_path, 3, cb, extra=[seen], check_val_every_n_epoch=2)
    assert seen.seen == [(2, 2), (4, 4), (6, 6)]
    assert len(list((tmp_path / "ck").glob("epoch=*.ckpt"))) == 1  # top-k still follows the monitor


def test_moved_run_folder_resumes_onto_its_own_last_checkpoint(tmp_path):
    cb = LastAndBestCheckpoint(dirpath=tmp_path / "a" / "ck", monitor="val/score", mode="max", save_last=True)
    _fit(tmp_path / "a", 1, cb)
    shutil.move(tmp_path / "a", tmp_path / "b")
    folder = tmp_path / "b" / "ck"
    cb = LastAndBestCheckpoint(dirpath=folder, monitor="val/score", mode="max", save_last=True)
    _fit(tmp_path / "b", 3, cb, ckpt_path=str(folder / "last.ckpt"))
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt"]
    assert _step(folder / "last.ckpt") == 3 * STEPS_PER_EPOCH
    # the best of the first run is tracked in its new place, so the worse later epochs did not replace it
    assert cb.best_model_path == str(folder / "epoch=0-step=2.ckpt") and float(cb.best_model_score) == 0.0


def _resume(folder: Path, callback: ModelCheckpoint, ckpt_path: Path, atomic: bool = True) -> None:
    trainer = L.Trainer(max_epochs=3, callbacks=[callback], plugins=[AtomicCheckpointIO()] if atomic else None,
                        default_root_dir=folder, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)
    trainer.fit(Tiny(), _loader(), _loader(), ckpt_path=str(ckpt_path))


def _name_a_victim(state: dict, folder: Path, victim: Path, how: str) -> str:
    """Edit a checkpoint callback's ``state`` so that resuming from it deletes ``victim``; the field edited."""
    escape = f"{folder}/../../{victim.name}"  # below the folder for pathlib's parents, which Lightning checks
    if how == "last":
        state["last_model_path"] = escape
        return "last_model_path"
    if how == "top_k":  # the worst of the top k, replaced by the next better score
        low = torch.tensor(-1e9)
        state.update(best_k_models={escape: low}, kth_best_model_path=escape, kth_value=low, best_model_score=low,
                     best_model_path=escape)
        return r"(best_model_path|kth_best_model_path|best_k_models)"
    if how == "moved_folder":  # another folder, whose paths visiontf re-bases onto the run's
        state["dirpath"] = "/old/run/ck"
        state.update(best_model_path="/old/run/ck/../../../" + str(victim).lstrip("/"), last_model_path="")
        return "best_model_path"
    if how == "double_slash":  # a name below the folder that joins to an absolute path when the folder is re-based
        state["dirpath"] = "/any/folder"
        state.update(best_model_path="/any/folder/" + str(victim), best_k_models={"/any/folder/" + str(victim): 1e9},
                     kth_best_model_path="/any/folder/" + str(victim), last_model_path="")
        return r"(best_model_path|kth_best_model_path|best_k_models)"
    state["last_model_path"] = [escape]  # not a path at all
    return "last_model_path"


def _trained_state(tmp_path: Path, callback: type) -> tuple[Path, Callable[[], ModelCheckpoint], dict, dict]:
    """A one-epoch run of ``callback`` in ``tmp_path/run/ck``: the folder, a maker of the same callback, the run's
    last.ckpt and that callback's state in it (to be edited)."""
    folder = tmp_path / "run" / "ck"
    make = functools.partial(callback, dirpath=folder, monitor="val/score", mode="max", save_last=True, save_top_k=1)
    _fit(tmp_path / "run", 1, make())
    ckpt = torch.load(folder / "last.ckpt", weights_only=True)
    [key] = [k for k in ckpt["callbacks"] if k.startswith(callback.__name__)]
    return folder, make, ckpt, ckpt["callbacks"][key]


@pytest.mark.parametrize("how", ["last", "top_k", "moved_folder", "double_slash", "not_a_path"])
@pytest.mark.parametrize("callback", [LastAndBestCheckpoint, ModelCheckpoint])
def test_a_checkpoint_cannot_name_files_outside_its_folder_for_deletion(tmp_path, how, callback):
    """Lightning restores a checkpoint callback's paths from the file and deletes the restored last and k-th best
    checkpoints when it replaces them; a path written ``<dirpath>/../../x`` passes its own check. Such a file is
    refused when it is read, naming the file and the field, and nothing is deleted: Lightning's ModelCheckpoint
    through visiontf's CheckpointIO, LastAndBestCheckpoint whatever reads the file."""
    from visiontf.io.weights import WeightsError

    folder, make, ckpt, state = _trained_state(tmp_path, callback)
    victim = tmp_path / "victim.txt"
    victim.write_text("not a checkpoint")
    field = _name_a_victim(state, folder, victim, how)
    hostile = tmp_path / "hostile.ckpt"
    torch.save(ckpt, hostile)
    readers = [(True, re.escape(str(hostile)))]
    if callback is LastAndBestCheckpoint:
        readers.append((False, "the checkpoint resumed from"))  # a plain Trainer's reader: the callback refuses
    for atomic, where in readers:
        with pytest.raises(WeightsError, match=rf"{where}: callbacks\[.*\]\.{field} is .*(outside the checkpoint folder|not a path)"):
            _resume(tmp_path / "run", make(), hostile, atomic=atomic)
        assert victim.read_text() == "not a checkpoint"


@pytest.mark.parametrize("callback", [LastAndBestCheckpoint, ModelCheckpoint])
def test_a_best_checkpoint_of_another_folder_is_not_tracked_nor_handed_to_the_loggers(tmp_path, callback, caplog):
    """Lightning restores ``best_model_path`` from a checkpoint of another folder, and the loggers that upload
    checkpoints (``log_model``: MLflow, W&B) send every file its checkpoint callbacks name: a file whose state says
    ``dirpath: ~/.ssh, best_model_path: ~/.ssh/id_rsa`` passes the check of its own folder. After the restore, every
    checkpoint callback keeps only paths in its own folder (``LastAndBestCheckpoint`` at once, the others when training
    starts), so the loggers see none elsewhere."""
    from lightning.pytorch.loggers.utilities import _scan_checkpoints

    folder, make, ckpt, state = _trained_state(tmp_path, callback)
    secret = tmp_path / "ssh" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text("a private key")
    state.update(dirpath=str(secret.parent), best_model_path=str(secret), last_model_path=str(secret),
                                  kth_best_model_path=str(secret), best_k_models={str(secret): torch.tensor(9.0)})
    torch.save(ckpt, tmp_path / "foreign.ckpt")
    seen = []

    class Scan(L.Callback):  # what a log_model logger would upload at a save, from the first epoch on
        def on_train_epoch_start(self, trainer, pl_module):
            seen.extend(p for c in trainer.checkpoint_callbacks for _, p, _, _ in _scan_checkpoints(c, {}))

    resumed = make()
    extra = [Scan()] if callback is LastAndBestCheckpoint else [LastAndBestCheckpoint(dirpath=tmp_path / "ours"), Scan()]
    with caplog.at_level(logging.WARNING, logger="visiontf.callbacks.checkpoint"):
        trainer = L.Trainer(max_epochs=2, callbacks=[resumed, *extra], plugins=[AtomicCheckpointIO()],
                            default_root_dir=tmp_path / "run", logger=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(Tiny(), _loader(), _loader(), ckpt_path=str(tmp_path / "foreign.ckpt"))
    assert str(secret) not in seen and all(Path(p).parent == folder for p in seen), seen
    assert Path(resumed.best_model_path).parent == folder and str(secret) not in resumed.best_k_models
    assert f"names {secret}, which are not checkpoint files of this run's checkpoint folder" in caplog.text
    assert secret.read_text() == "a private key"


def test_validating_a_checkpoint_of_another_run_forgets_its_paths_without_a_warning(tmp_path, caplog):
    """Lightning restores the callbacks for ``validate`` too (``tools/eval.py``, ``make demo``'s evaluation in a folder
    of its own): the other run's paths are forgotten there as well, but the warning about the best checkpoints starting
    afresh is for training, where it is given once."""
    folder, make, ckpt, state = _trained_state(tmp_path, LastAndBestCheckpoint)
    kwargs = dict(plugins=[AtomicCheckpointIO()], logger=False, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0)
    evaluating = make(dirpath=tmp_path / "eval" / "ck")
    with caplog.at_level(logging.WARNING, logger="visiontf.callbacks.checkpoint"):
        L.Trainer(callbacks=[evaluating], default_root_dir=tmp_path / "eval", **kwargs).validate(
            Tiny(), _loader(), ckpt_path=str(folder / "last.ckpt"))
    assert evaluating.best_model_path == "" and evaluating.last_model_path == ""
    assert "not checkpoint files" not in caplog.text
    resumed = make(dirpath=tmp_path / "other" / "ck")
    with caplog.at_level(logging.WARNING, logger="visiontf.callbacks.checkpoint"):
        L.Trainer(max_epochs=2, callbacks=[resumed], default_root_dir=tmp_path / "other", **kwargs).fit(
            Tiny(), _loader(), _loader(), ckpt_path=str(folder / "last.ckpt"))
    assert caplog.text.count("which are not checkpoint files of this run's checkpoint folder") == 1


@pytest.mark.parametrize("callback", [LastAndBestCheckpoint, ModelCheckpoint])
def test_a_restored_path_to_a_file_of_the_folder_that_is_no_checkpoint_is_forgotten(tmp_path, callback):
    """A path inside the run's checkpoint folder passes the folder checks; Lightning would still delete what it names
    at the next save. Only checkpoint files (the callback's ``FILE_EXTENSION``) are kept."""
    folder, make, ckpt, state = _trained_state(tmp_path, callback)
    notes = folder / "notes.txt"
    notes.write_text("the user's")
    state["last_model_path"] = str(notes)
    torch.save(ckpt, tmp_path / "resume.ckpt")
    resumed = make()
    extra = [] if callback is LastAndBestCheckpoint else [LastAndBestCheckpoint(dirpath=tmp_path / "ours")]
    trainer = L.Trainer(max_epochs=2, callbacks=[resumed, *extra], plugins=[AtomicCheckpointIO()],
                        default_root_dir=tmp_path / "run", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Tiny(), _loader(), _loader(), ckpt_path=str(tmp_path / "resume.ckpt"))
    assert notes.read_text() == "the user's" and resumed.last_model_path != str(notes)


@pytest.mark.parametrize("edit, words", [
    ({"best_model_score": "high"}, r"\.best_model_score is 'high', not a score"),
    ({"kth_value": [1.0]}, r"\.kth_value is \[1\.0\], not a score"),
    ({"best_k_models": {"@/a.ckpt": "x"}}, r"\.best_k_models\['@/a\.ckpt'\] is 'x', not a score"),
    ({"best_k_models": {"@/a.ckpt": 1.0}, "kth_best_model_path": "@/b.ckpt"},
     r"\.kth_best_model_path is '@/b\.ckpt', not one of its best_k_models"),
])
def test_scores_and_the_kth_best_of_a_checkpoint_callback_are_checked_by_name(tmp_path, edit, words):
    """What Lightning compares a new score with, and the k-th best it pops from the best k: a string score failed with
    a bare TypeError, a k-th best outside the best k with a KeyError, at the first validation after resuming."""
    from visiontf.io.weights import WeightsError

    folder = "runs/ck"  # as written in the file (short: the messages quote values bounded)
    state = {"dirpath": folder, "best_model_path": "", "best_model_score": None, "kth_best_model_path": "",
             "best_k_models": {}, "last_model_path": ""}
    state.update({k: ({p.replace("@", folder): s for p, s in v.items()} if isinstance(v, dict) else
                      v.replace("@", folder) if isinstance(v, str) and v.startswith("@") else v) for k, v in edit.items()})
    torch.save({"state_dict": {}, "pytorch-lightning_version": L.__version__,
                "callbacks": {"ModelCheckpoint{}": state}}, tmp_path / "odd.ckpt")
    with pytest.raises(WeightsError, match=r"odd\.ckpt: callbacks\['ModelCheckpoint\{\}'\]" + words.replace("@", re.escape(folder))):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "odd.ckpt")


def test_without_the_check_lightning_deletes_what_a_checkpoint_names(tmp_path):
    """What the test above guards against, shown on Lightning's own reader and ModelCheckpoint: if this fails,
    Lightning has closed the hole itself."""
    folder, make, ckpt, state = _trained_state(tmp_path, ModelCheckpoint)
    victim = tmp_path / "victim.txt"
    victim.write_text("not a checkpoint")
    _name_a_victim(state, folder, victim, "last")
    torch.save(ckpt, tmp_path / "hostile.ckpt")
    _resume(tmp_path / "run", make(), tmp_path / "hostile.ckpt", atomic=False)
    assert not victim.exists()


def test_the_w_and_b_callback_uploads_only_files_of_the_run_folder(tmp_path, monkeypatch):
    from visiontf.callbacks import wandb_checkpoints

    uploaded = []
    monkeypatch.setattr(wandb_checkpoints, "log_wandb_checkpoints", lambda trainer, found: uploaded.append(found) or ["x"])
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "epoch=0.ckpt").write_text("x")
    (tmp_path / "secret").write_text("x")
    cb = ModelCheckpoint(dirpath=folder)
    cb.best_model_path, cb.last_model_path = str(tmp_path / "secret"), str(folder / "epoch=0.ckpt")
    trainer = types.SimpleNamespace(is_global_zero=True, checkpoint_callback=cb)
    wandb_checkpoints.WandbCheckpoints().on_fit_end(trainer, None)
    assert uploaded == [{"last": folder / "epoch=0.ckpt"}]


def test_with_model_ema_last_holds_the_average_of_the_latest_step(tmp_path):
    ema = ModelEMA(decay=0.9, warmup_steps=0)
    cb = LastAndBestCheckpoint(dirpath=tmp_path / "ck", monitor="val/score", mode="max", save_last=True)
    _fit(tmp_path, 2, cb, extra=[ema])
    ck = torch.load(tmp_path / "ck" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ck["global_step"] == 2 * STEPS_PER_EPOCH
    assert int(ck["averaging_state"]["n_averaged"]) == 2 * STEPS_PER_EPOCH
    averaged = ema._average_model.module.state_dict()
    assert all(torch.equal(ck["state_dict"][k], averaged[k]) for k in averaged)
    assert set(ck["current_model_state"]) == set(averaged)
    # and it resumes
    cb2 = LastAndBestCheckpoint(dirpath=tmp_path / "ck", monitor="val/score", mode="max", save_last=True)
    _fit(tmp_path, 3, cb2, ckpt_path=str(tmp_path / "ck" / "last.ckpt"), extra=[ModelEMA(decay=0.9, warmup_steps=0)])
    assert _step(tmp_path / "ck" / "last.ckpt") == 3 * STEPS_PER_EPOCH


def _payload(i: int, mb: int = 1) -> dict:
    return {"i": i, "data": torch.full((mb * 262_144,), float(i))}


def _assert_complete(path: Path) -> int:
    ck = torch.load(path, map_location="cpu", weights_only=True)
    assert torch.all(ck["data"] == float(ck["i"])), "a mixed or partial state"
    return int(ck["i"])


def test_a_failed_write_keeps_the_previous_checkpoint_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """ENOSPC simulated half way through the write (the real full disk is the next test)."""
    dest = tmp_path / "last.ckpt"
    atomic_save(_payload(1), dest)

    real_save = torch.save

    def half_then_enospc(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(f.tell() // 2)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_enospc)
    with pytest.raises(OSError) as info:
        atomic_save(_payload(2), dest)
    assert info.value.errno == errno.ENOSPC and "previous file is unchanged" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert _assert_complete(dest) == 1


_FULL_DISK = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[2])
from visiontf.io.atomic_write import atomic_save
folder = sys.argv[1]
atomic_save({"i": 1, "data": torch.full((262_144,), 1.0)}, folder + "/last.ckpt")       # 1 MB: fits
try:
    atomic_save({"i": 2, "data": torch.full((4 * 262_144,), 2.0)}, folder + "/last.ckpt")  # 4 MB: does not
    error = None
except OSError as e:
    error = [e.errno, str(e)]
import os
print(json.dumps({"error": error, "files": sorted(os.listdir(folder)),
                  "i": int(torch.load(folder + "/last.ckpt", weights_only=True)["i"])}))
"""


@pytest.mark.slow
def test_full_filesystem_keeps_the_previous_checkpoint(tmp_path):
    """A real ENOSPC: a 2 MiB tmpfs mounted in a private user+mount namespace (``unshare``)."""
    mount = tmp_path / "small"
    mount.mkdir()
    script = tmp_path / "full.py"
    script.write_text(_FULL_DISK)
    shell = (f"mount -t tmpfs -o size=2m tmpfs {mount} && "
             f"{sys.executable} {script} {mount} {ROOT}")
    if shutil.which("unshare") is None:
        pytest.skip("unshare not available: the simulated ENOSPC test covers this case")
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "mount" in proc.stderr and "Traceback" not in proc.stderr:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()[:200]}); the simulated ENOSPC test covers this case")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] is not None and out["error"][0] == errno.ENOSPC
    assert "previous file is unchanged" in out["error"][1], out["error"]
    assert out["files"] == ["last.ckpt"], "no temporary file left on the full disk"
    assert out["i"] == 1


_KILL_LOOP = r"""
import json, os, random, signal, sys, time
import torch
sys.path.insert(0, sys.argv[2])
from visiontf.io.atomic_write import atomic_save
folder, rounds = sys.argv[1], int(sys.argv[3])
dest = folder + "/last.ckpt"
rng = random.Random(0)
report = []
for r in range(rounds):
    pid = os.fork()
    if pid == 0:  # the writer: 8 MB checkpoints in a loop until killed
        i = 1000 * (r + 1)
        while True:
            i += 1
            atomic_save({"i": i, "data": torch.full((8 * 262_144,), float(i))}, dest)
    time.sleep(rng.uniform(0.05, 0.4))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    files = sorted(os.listdir(folder))
    state = None
    if os.path.exists(dest):
        ck = torch.load(dest, weights_only=True)
        state = [int(ck["i"]), bool(torch.all(ck["data"] == float(ck["i"])))]
    report.append({"files": files, "state": state})
atomic_save({"i": -1, "data": torch.zeros(4)}, dest)  # a later save removes a killed write's temporary file
print(json.dumps({"rounds": report, "after": sorted(os.listdir(folder))}))
"""


@pytest.mark.slow
def test_sigkill_during_writes_never_leaves_a_partial_checkpoint(tmp_path):
    """Kill a process that writes 8 MB checkpoints in a loop, at random moments, 8 times (one forked
    writer per round); the run folder is on /dev/shm, another filesystem than $TMPDIR (where
    Lightning's own writer stages its files before copying them across)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("/dev/shm not writable")
    assert os.stat(shm).st_dev != os.stat(tempfile.gettempdir()).st_dev, "/dev/shm should be another filesystem"
    folder = shm / f"visiontf-kill-{os.getpid()}-{random.randrange(1 << 30)}"
    folder.mkdir()
    script = tmp_path / "kill_loop.py"
    script.write_text(_KILL_LOOP)
    try:
        proc = subprocess.run([sys.executable, str(script), str(folder), str(ROOT), "8"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    completed = 0
    for r in out["rounds"]:
        named = [f for f in r["files"] if not f.startswith(".")]
        assert named in ([], ["last.ckpt"]) and len(r["files"]) <= 2, r["files"]  # at most one temporary file
        if r["state"] is not None:
            assert r["state"][1], f"last.ckpt mixes two states: {r}"
            completed += 1
    assert completed >= 6, out["rounds"]
    assert out["after"] == ["last.ckpt"]


def test_a_run_ending_before_its_first_validation_says_there_is_no_best_checkpoint(tmp_path, caplog):
    cb = LastAndBestCheckpoint(dirpath=tmp_path / "ck", monitor="val/score", mode="max", save_last=True)
    with caplog.at_level(logging.WARNING, logger="visiontf.callbacks.checkpoint"):
        _fit(tmp_path, 3, cb, max_steps=1)  # the first validation would come at step 2
    assert "training ended at step 1 before any validation logged 'val/score': no best checkpoint" in caplog.text
    assert cb.best_model_path == "" and _step(tmp_path / "ck" / "last.ckpt") == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="visiontf.callbacks.checkpoint"):
        _fit(tmp_path / "full", 1, LastAndBestCheckpoint(dirpath=tmp_path / "ck2", monitor="val/score", save_last=True))
    assert "no best checkpoint" not in caplog.text


def test_a_killed_writes_temporary_of_any_checkpoint_name_is_removed_by_the_next_run(tmp_path):
    """A run killed while writing ``epoch000-step000002.ckpt`` (a best checkpoint, whose name is never written
    again) left ``.epoch000-step000002.ckpt.<hex>.tmp``: ``atomic_save`` of other names keeps it, the checkpoint
    plugin removes every temporary of its folder at its first save there, and only then."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    stale = folder / ".epoch000-step000002.ckpt.0123abcd.tmp"
    stale.write_bytes(b"partial")
    other = tmp_path / ".notes.txt.0123abcd.tmp"  # another folder: not the plugin's business
    other.write_bytes(b"x")
    atomic_save({"i": 1}, folder / "last.ckpt")
    assert stale.exists(), "atomic_save removes only the temporaries of the file it writes"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"i": 2}, folder / "last.ckpt")
    assert not stale.exists() and other.exists()
    assert sorted(os.listdir(folder)) == ["last.ckpt"]
    # later saves of this process leave the folder's files alone (a temporary there could be its own)
    late = folder / ".epoch001-step000004.ckpt.0123abcd.tmp"
    late.write_bytes(b"partial")
    io.save_checkpoint({"i": 3}, folder / "last.ckpt")
    assert late.exists()


class _RunsACommand:
    """Unpickled, it would run ``touch`` on the marker (what ``torch.load(weights_only=False)`` does)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_is_read_as_data_whatever_weights_only_lightning_is_given(tmp_path):
    """Lightning's fit/validate take ``weights_only`` (a config key and an option of tools/train.py); False would
    unpickle the file. The plugin refuses it, and reads every local checkpoint with visiontf's allow-list."""
    from visiontf.io.weights import WeightsError

    marker = tmp_path / "payload_ran"
    hostile = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": {}, "callbacks": _RunsACommand(marker)}, hostile)
    io = AtomicCheckpointIO()
    with pytest.raises(WeightsError, match=r"hostile\.ckpt: weights_only false"):
        io.load_checkpoint(hostile, weights_only=False)
    for weights_only in (None, True):
        with pytest.raises(WeightsError, match=r"hostile\.ckpt"):
            io.load_checkpoint(hostile, weights_only=weights_only)
    assert not marker.exists()
    clean = tmp_path / "clean.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "pytorch-lightning_version": L.__version__}, clean)
    assert torch.equal(io.load_checkpoint(clean)["state_dict"]["w"], torch.ones(2))


def test_only_lightning_registry_spellings_skip_the_checkpoint_checks(tmp_path):
    """``registry`` and ``registry:NAME`` are Lightning's model registry; a file named ``registry_x.ckpt`` is a file,
    checked as any other (it was passed on to Lightning unchecked)."""
    from visiontf.cli.checks import checkpoint_file
    from visiontf.core.errors import UsageError

    assert checkpoint_file("registry", lightning_keywords=True) is None
    assert checkpoint_file("registry:my-model:v1", lightning_keywords=True) is None
    (tmp_path / "registry_x.ckpt").write_text("not a checkpoint")
    with pytest.raises(UsageError, match="not a PyTorch checkpoint"):
        checkpoint_file(str(tmp_path / "registry_x.ckpt"), lightning_keywords=True)
    os.chdir(tmp_path)
    try:
        with pytest.raises(UsageError, match="registry_x.ckpt: not a PyTorch checkpoint"):
            checkpoint_file("registry_x.ckpt", lightning_keywords=True)
    finally:
        os.chdir(Path(__file__).resolve().parents[2])
