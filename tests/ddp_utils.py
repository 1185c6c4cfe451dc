"""Helpers for the multi-process tests: run ``tools/*.py`` as subprocesses with a clean, pinned env.

Also an entry point: ``python tests/ddp_utils.py --runs RUNS.json`` runs several evaluations or fits of one
test in one launch (:func:`evaluate_runs`, :func:`launch_runs`): importing torch and Lightning is most of a
tiny run's cost. Its
"padded" run replaces every data module's ``eval_sampler`` by ``None``, so Lightning falls back to its default
``DistributedSampler`` for eval loaders, which pads ranks by repeating samples; Lightning's CPU DDP launcher
re-runs this same script for rank 1, so the patch holds on every rank. The tests use it to prove that the DDP
equality check can fail.
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


def evaluate(config: str, ckpt: Path, out: Path, overrides: list[str], ddp: bool = False, timeout: float = 300) -> dict[str, float]:
    """``tools/eval.py`` on 1 process or 2 DDP CPU processes; returns the stats JSON."""
    args = ["tools/eval.py", "--config", config, "--ckpt_path", str(ckpt), *overrides,
            "--trainer.enable_progress_bar=false", "--trainer.logger=false", "--output", str(out)]
    args += ddp_args() if ddp else ["--trainer.devices=1"]
    run(args, timeout=timeout)
    return json.loads(out.read_text())


#: the evaluations :func:`evaluate_runs` knows: processes, and whether Lightning's repeating sampler is put back
EVAL_RUNS = {"single": (1, False), "ddp": (2, False), "padded": (2, True)}


def evaluate_runs(config: str, ckpt: Path, out_dir: Path, overrides: list[str], runs: tuple[str, ...] = ("single", "ddp"),
                  timeout: float = 300) -> dict[str, dict[str, float]]:
    """:func:`evaluate` for each of ``runs`` (names of :data:`EVAL_RUNS`), all in one launch of this script.

    The runs go in order in one process; the first 2-process run makes Lightning start rank 1, which runs the
    same list (skipping the 1-process runs), and every later run reuses both ranks, as a script that fits
    and then tests under DDP does. Returns run name -> the stats JSON ``tools/eval.py`` wrote."""
    cases = []
    for name in runs:
        processes, repeating = EVAL_RUNS[name]
        argv = ["--config", config, "--ckpt_path", str(ckpt), *overrides, "--trainer.enable_progress_bar=false",
                "--trainer.logger=false", "--output", str(out_dir / f"{name}.json"),
                *(ddp_args() if processes == 2 else ["--trainer.devices=1"])]
        cases.append({"argv": argv, "processes": processes, "repeating_sampler": repeating})
    launch_runs(cases, out_dir / "eval_runs.json", timeout=timeout)
    return {name: json.loads((out_dir / f"{name}.json").read_text()) for name in runs}


def launch_runs(cases: list[dict], runs_file: Path, timeout: float = 300, env: dict[str, str] | None = None) -> None:
    """Run ``cases`` in order in one launch of this script (what :func:`evaluate_runs` does, for any arguments).

    Each case: ``{"argv": [...], "processes": 1 or 2, "tool": "eval" (default) or "train", "env": {...}?,
    "repeating_sampler": bool?}``; ``argv`` is the tool's command line without the script (a 2-process case
    carries :func:`ddp_args`), ``env`` is set on every rank for that case only. The 1-process cases go first:
    rank 1 joins at the first 2-process case and runs the rest with rank 0."""
    processes = [case["processes"] for case in cases]
    assert processes == sorted(processes), f"1-process runs go before the 2-process ones: {processes}"
    runs_file.write_text(json.dumps([{**case, "argv": [str(a) for a in case["argv"]]} for case in cases]))
    run(["tests/ddp_utils.py", "--runs", str(runs_file)], timeout=timeout, env=env)


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


def _patch_eval_samplers() -> dict:
    """Replace every data module's ``eval_sampler`` by one that gives Lightning's default; returns what to restore."""
    import importlib

    from visiontf.tasks.task_table import data_module_class_paths

    # visiontf.data.samplers: its eval_batch_sampler (the COCO eval loaders) looks eval_sampler up there;
    # then the module of every data module in the task table
    modules = dict.fromkeys(["visiontf.data.samplers", *(p.rpartition(".")[0] for p in data_module_class_paths())])
    replaced = {}
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if hasattr(mod, "eval_sampler"):
            replaced[mod] = mod.eval_sampler
            mod.eval_sampler = lambda dataset, trainer: None
    return replaced


def _launched_runs(runs_file: Path) -> int:
    from visiontf.cli import eval_main, train_main

    # Lightning's launcher starts rank 1 as `python <this script> --runs FILE` with LOCAL_RANK set: it joins
    # at the first 2-process run, so it leaves out the 1-process ones
    later_rank = os.environ.get("LOCAL_RANK", "0") != "0"
    for case in json.loads(runs_file.read_text()):
        if case["processes"] == 1 and later_rank:
            continue
        replaced = _patch_eval_samplers() if case.get("repeating_sampler") else {}
        environ = dict(os.environ)
        own_env = {k: os.environ.get(k) for k in case.get("env") or {}}
        os.environ.update(case.get("env") or {})
        try:
            code = (train_main if case.get("tool") == "train" else eval_main)(case["argv"])
        finally:
            for mod, original in replaced.items():
                mod.eval_sampler = original
            for k, v in own_env.items():  # the case's own variables only: a 2-process run's stay for the next
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if case["processes"] == 1:
                # a config's `strategy: ddp` on one device makes a process group of 1 and sets LOCAL_RANK,
                # MASTER_PORT, ...: left there, the next 2-process run would take them for its own (Lightning
                # starts no rank 1 and reuses the group of 1)
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    dist.destroy_process_group()
                os.environ.clear()
                os.environ.update(environ)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:2] != ["--runs"] or len(sys.argv) != 3:
        sys.exit("usage: python tests/ddp_utils.py --runs RUNS.json")
    sys.exit(_launched_runs(Path(sys.argv[2])))
