"""Helpers for the multi-process tests: run ``tools/*.py`` as subprocesses with a clean, pinned env.

Also an entry point: ``python tests/ddp_utils.py <args of tools/eval.py>`` runs ``tools/eval.py``
unchanged, except that with ``VISIONTF_TEST_REPEATING_SAMPLER=1`` every data module's
``eval_sampler`` is replaced by ``None``, so Lightning falls back to its default
``DistributedSampler`` for eval loaders, which pads ranks by repeating samples. Lightning's CPU
DDP launcher re-runs this same script for rank 1, so the patch holds on every rank. The tests use
it to prove that the DDP equality check can fail.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPEATING_SAMPLER_ENV = "VISIONTF_TEST_REPEATING_SAMPLER"
# Lightning/torchrun variables a parent process (e.g. a DDP CI runner) may have set; a child that
# inherits them would think it is already one rank of a bigger job.
_DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_NTASKS")


def free_port() -> int:
    """A TCP port that was free a moment ago (each DDP run gets its own, so parallel tests never clash)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The test env: unbuffered output, one OpenMP thread per process, a fresh rendezvous port."""
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    env.update(extra)
    return env


def run(args: list[str], timeout: float = 300, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``python <args>`` from the repository root; on failure the assertion shows the output's tail."""
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env or subprocess_env())
    if check:
        assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def ddp_args(devices: int = 2) -> list[str]:
    return ["--trainer.accelerator=cpu", f"--trainer.devices={devices}", "--trainer.strategy=ddp"]


def evaluate(config: str, ckpt: Path, out: Path, overrides: list[str], ddp: bool = False,
             repeating_sampler: bool = False, timeout: float = 300) -> dict[str, float]:
    """``tools/eval.py`` on 1 process or 2 DDP CPU processes; returns the stats JSON."""
    script = "tests/ddp_utils.py" if repeating_sampler else "tools/eval.py"
    env = subprocess_env(**({REPEATING_SAMPLER_ENV: "1"} if repeating_sampler else {}))
    args = [script, "--config", config, "--ckpt_path", str(ckpt), *overrides,
            "--trainer.enable_progress_bar=false", "--trainer.logger=false", "--output", str(out)]
    args += ddp_args() if ddp else ["--trainer.devices=1"]
    run(args, timeout=timeout, env=env)
    return json.loads(out.read_text())


try:
    import lightning as L

    class KillAfterStep(L.Callback):
        """Test-only: SIGKILL this process (no clean shutdown, no final checkpoint) once ``step`` optimizer
        steps are done. Use with ``PYTHONPATH=tests`` and ``--trainer.callbacks+=ddp_utils.KillAfterStep``."""

        def __init__(self, step: int) -> None:
            self.step = step

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            # checkpoint callbacks run after this one, so nothing of step `step` is saved
            if trainer.global_step >= self.step:
                os.kill(os.getpid(), signal.SIGKILL)
except ModuleNotFoundError:  # pragma: no cover
    pass


def _patch_eval_samplers() -> None:
    import importlib

    from visiontf.tasks.task_table import data_module_class_paths

    # visiontf.data.samplers: its eval_batch_sampler (the COCO eval loaders) looks eval_sampler up there;
    # then the module of every data module in the task table
    modules = dict.fromkeys(["visiontf.data.samplers", *(p.rpartition(".")[0] for p in data_module_class_paths())])
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if hasattr(mod, "eval_sampler"):
            mod.eval_sampler = lambda dataset, trainer: None


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if os.environ.get(REPEATING_SAMPLER_ENV) == "1":
        _patch_eval_samplers()
    from visiontf.cli import eval_main

    sys.exit(eval_main())
