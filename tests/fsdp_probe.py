"""Test-only callback for the FSDP test: each rank writes what FSDP did to the model when training starts.

Used as ``--trainer.callbacks+=fsdp_probe.FSDPProbe`` with ``tests`` on ``PYTHONPATH``; the JSON goes to
``$VISIONTF_FSDP_PROBE/rank{R}.json``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L


class FSDPProbe(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped = trainer.model
        first = pl_module.model.first_stage_model
        info = {
            "wrapped_in_fsdp": isinstance(wrapped, FullyShardedDataParallel),
            "world_size": trainer.world_size,
            "fsdp_units": len(FullyShardedDataParallel.fsdp_modules(wrapped)),
            # FSDP (use_orig_params) turns each parameter it shards into a view of this rank's shard
            "transformer_local_numel": sum(p.numel() for p in pl_module.model.transformer.parameters()),
            "ignored_numel": sum(p.numel() for p in getattr(wrapped, "_ignored_params", ())),
            "first_stage_numel": sum(p.numel() for p in first.parameters()),
            "first_stage_trainable": sum(p.requires_grad for p in first.parameters()),
            "optimizer_params": sum(len(g["params"]) for g in trainer.optimizers[0].param_groups),
        }
        out = Path(os.environ["VISIONTF_FSDP_PROBE"])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(info))
