"""The inference form of the real-time DETRs (RT-DETR, RT-DETRv2, D-FINE, DEIM): :func:`fuse_for_inference`.

What it changes, in place, on a model in evaluation mode:

* the backbone (ResNet-vd, HGNetv2): every BatchNorm folded into the convolution before it; the frozen BatchNorms of
  the large models, which their convolutions otherwise re-apply to the weight at every call, baked in once;
* the hybrid encoder: every RepVGG block re-parameterised into one 3x3 convolution (its 3x3 and 1x1 branches with
  their BatchNorms; the original's ``convert_to_deploy`` does the same), every other BatchNorm folded;
* the decoder's input projections: their BatchNorms folded.

The outputs equal the unfused model's up to float rounding (``tests/models/rtdetr/test_rtdetr_deploy.py``: within
1e-5 in float32, 1e-10 in float64). The model is then for inference only: its BatchNorms are gone (the state dict
changes: load weights first, fuse after), and a forward in training mode is refused with a one-line error. Fusing
again finds nothing left and changes nothing. :func:`visiontf.inference.export.export_onnx` exports a fused copy
(the caller's model is left as it is), and ``benchmarks/realtime_detr.py`` times it (docs/benchmarks.md).
"""
from __future__ import annotations

from torch import nn

__all__ = ["FUSED_ATTR", "fuse_for_inference", "is_fused"]

#: the attribute a fused model carries (True), read by :func:`is_fused`
FUSED_ATTR = "fused_for_inference"


def is_fused(model: nn.Module) -> bool:
    """Whether :func:`fuse_for_inference` ran on ``model``."""
    return bool(getattr(model, FUSED_ATTR, False))


def _refuse_training(module: nn.Module, args) -> None:
    if module.training:
        raise RuntimeError(f"{type(module).__name__} was fused for inference (fuse_for_inference: its BatchNorms are folded into "
                           "the convolutions); call eval(), or train an unfused model (create_model / load the weights again)")


def fuse_for_inference(model: nn.Module) -> dict[str, int]:
    """Fuse an RT-DETR / D-FINE model for inference, in place (see the module docstring); returns the folds made per
    part (``backbone``, ``encoder``, ``decoder``; all 0 on a model already fused).

    The model is put in evaluation mode; a forward in training mode afterwards raises. Backbones without a
    ``fuse_for_inference`` method (another ``Backbone`` given to ``build_rtdetr``) are left unfused."""
    from visiontf.nn.cpu_convolution import use_onednn_convolutions
    from visiontf.nn.fold_bn import fold_batchnorms

    for part in ("backbone", "encoder", "decoder"):
        if not hasattr(model, part):
            raise TypeError(f"fuse_for_inference takes an RT-DETR / D-FINE model (backbone, encoder, decoder), got {type(model).__name__}")
    model.eval()
    backbone_fuse = getattr(model.backbone, "fuse_for_inference", None)
    counts = {
        "backbone": backbone_fuse() if callable(backbone_fuse) else 0,
        "encoder": model.encoder.fuse_for_inference(),
        "decoder": sum(fold_batchnorms(proj) for proj in model.decoder.input_proj),
    }
    use_onednn_convolutions(model)  # the folds' new convolutions are plain ones
    if not is_fused(model):
        model.register_forward_pre_hook(_refuse_training)
        setattr(model, FUSED_ATTR, True)
    return counts
