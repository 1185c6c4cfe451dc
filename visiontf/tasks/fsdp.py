"""Lightning's FSDP strategy, made to run on the CPU and to leave frozen sub-networks unsharded.

Lightning's ``FSDPStrategy`` as it ships refuses a CPU accelerator in two places:

* ``Trainer(strategy="fsdp", accelerator="cpu")`` raises "The strategy `fsdp` requires a GPU accelerator"
  (``_AcceleratorConnector._check_strategy_and_fallback`` tests the *string* ``"fsdp"`` and
  ``type(strategy) is FSDPStrategy``: a subclass instance passes);
* it then wraps the model with ``device_id=root_device.index``, ``None`` on the CPU, and torch's
  ``FullyShardedDataParallel`` infers the device from the parameters or the current accelerator and
  raises "FSDP needs a non-CPU accelerator device" when both are the CPU. Given
  ``device_id=torch.device("cpu")`` explicitly, torch's FSDP shards and trains over gloo.

:class:`FSDPStrategy` wraps the model itself with that explicit device (on GPUs: the GPU, as
Lightning does) and hands the wrapped model to Lightning, which then proceeds unchanged (the
activation checkpointing, full or sharded checkpoints, the optimiser state gathering). It also puts
every sub-network whose parameters are all frozen (a VQGAN transformer's first stage, a tokenizer's
LPIPS) in FSDP's ``ignored_modules``: such a module is kept whole on every rank and moved to the
device, never flattened, sharded or gathered, and holds no optimiser state; it is saved in
checkpoints as before. ``wrap_modules`` names module classes (import paths, a CLI-friendly form of
Lightning's ``auto_wrap_policy={Block}``) to shard one by one, e.g. the GPT's blocks.

On the CPU, full checkpoints gather the optimiser state without torch's CPU offload, which there
aliases every state to the last one gathered (see :meth:`FSDPStrategy.optimizer_state`).
"""
from __future__ import annotations

import importlib
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy as LightningFSDPStrategy
from torch import nn

from visiontf.core.importable import check_importable


def frozen_subtrees(module: nn.Module) -> list[nn.Module]:
    """The largest sub-modules of ``module`` that hold parameters, none of them trainable."""
    found: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            params = list(child.parameters())
            if params and not any(p.requires_grad for p in params):
                found.append(child)
            elif params:
                visit(child)

    visit(module)
    return found


def _import_class(path: str) -> type[nn.Module]:
    # the paths come from a config, which may name block classes of visiontf and the user's admitted packages, and
    # torch's and timm's already imported: an import is code running (visiontf.core.importable)
    check_importable(path, "FSDPStrategy: wrap_modules", imported_roots=FSDPStrategy.imported_roots)
    module_name, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"FSDPStrategy: wrap_modules entry {path!r} is not an importable class "
                         "(give module.path.ClassName, e.g. visiontf.models.vqgan.gpt.Block)") from e
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"FSDPStrategy: wrap_modules entry {path!r} is not an nn.Module class")
    return cls


class FSDPStrategy(LightningFSDPStrategy):
    """``lightning.pytorch.strategies.FSDPStrategy`` that also runs on the CPU (gloo) and never shards frozen modules.

    Takes Lightning's arguments (``sharding_strategy``, ``state_dict_type``, ``cpu_offload``, ...)
    and ``wrap_modules``: class import paths for the auto-wrap policy.
    """

    #: the arguments that name classes to import, checked in a config before anything is built
    #: (visiontf.cli.config_imports), and the packages whose classes they may also name when already imported
    import_path_arguments = ("wrap_modules",)
    imported_roots = ("torch", "timm")

    def __init__(self, *args: Any, wrap_modules: list[str] | None = None, **kwargs: Any) -> None:
        if wrap_modules:
            if kwargs.get("auto_wrap_policy") is not None:
                raise ValueError("FSDPStrategy: give wrap_modules or auto_wrap_policy, not both")
            kwargs["auto_wrap_policy"] = {_import_class(p) for p in wrap_modules}
        super().__init__(*args, **kwargs)

    def _setup_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            kwargs = dict(self.kwargs)
            ignored = frozen_subtrees(model)
            if ignored:
                kwargs["ignored_modules"] = [*kwargs.get("ignored_modules", []), *ignored]
            for m in ignored:  # FSDP moves only what it manages
                m.to(self.root_device)
            # torch's FSDP takes the CPU only when told so explicitly (index None means "infer": an accelerator)
            device_id = self.root_device if self.root_device.type == "cpu" else self.root_device.index
            model = FullyShardedDataParallel(module=model, cpu_offload=self.cpu_offload,
                                             mixed_precision=self.mixed_precision_config,
                                             sharding_strategy=self.sharding_strategy, device_id=device_id, **kwargs)
            # applied above; Lightning warns about a policy given for a model that is already wrapped
            self.kwargs.pop("auto_wrap_policy", None)
        return super()._setup_model(model)

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        if self.root_device.type != "cpu" or self._state_dict_type != "full":
            return super().optimizer_state(optimizer)
        from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, OptimStateKeyType, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer wraps it
        # torch's FSDP gathers each optimiser state (exp_avg, then exp_avg_sq) into one reused buffer and,
        # with offload_to_cpu (Lightning's setting), copies each out with .cpu(): no copy on the CPU, so every
        # state aliases the last one and the checkpoint's exp_avg holds exp_avg_sq (a resume then steps
        # wrongly). Without the offload, with nothing to offload here, torch clones each state instead.
        with FSDP.state_dict_type(self.model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=False, rank0_only=True),
                                  FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True)):
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # the standard layout (parameter ids), as Lightning saves it
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
        return state


def clip_sharded_grad_norm(task, gradient_clip_val: float | None, gradient_clip_algorithm: str | None) -> bool:
    """Clip by the global gradient norm when ``task`` trains under FSDP; False (nothing done) otherwise.

    Lightning's ``FSDPPrecision`` refuses ``gradient_clip_algorithm='norm'``: each rank holds a shard
    of the gradients, so the norm needs FSDP's own ``clip_grad_norm_`` (a reduction over the ranks).
    Call from ``LightningModule.configure_gradient_clipping``.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    wrapped = task.trainer.model if task._trainer is not None else None  # noqa: SLF001 - no trainer: not FSDP
    if not gradient_clip_val or not isinstance(wrapped, FullyShardedDataParallel):
        return False
    if gradient_clip_algorithm not in (None, "norm"):
        return False
    wrapped.clip_grad_norm_(gradient_clip_val)
    return True
__all__ = ["FSDPStrategy", "clip_sharded_grad_norm", "frozen_subtrees"]
