"""The architecture of :class:`~visiontf.models.deformable_detr.deformable_detr.DeformableDETR`, as one object.

The model takes these as flat keyword arguments (what configs' ``model_kwargs``, checkpoints'
hyper-parameters and the registered variants pass, so LightningCLI still shows each one) and keeps
them together as ``model.arch_options``, checked once here. Its other groups:
:class:`~visiontf.models.deformable_detr.dino_options.DinoOptions` (the DINO line's training options) and
:class:`~visiontf.models.postprocess_options.PostprocessOptions`. The backbone's arguments are
passed to :class:`~visiontf.models.backbones.detr_backbone.DetrBackbone` and not kept.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["DeformableArchOptions"]


@dataclass(frozen=True)
class DeformableArchOptions:
    """The transformer, queries and heads of a Deformable DETR (defaults: the published R50 models).

    Args:
        hidden_dim, nheads, enc_layers, dec_layers, dim_feedforward, dropout: the transformer.
        num_queries: object queries (also the number of two-stage proposals kept).
        num_feature_levels: levels L. 1: C5 only; 2-3: the last L of C3, C4, C5; 4+: C3-C5 and
            L - 3 extra levels, each a 3x3 stride-2 conv of the previous one.
        enc_n_points, dec_n_points: sampling points per head and level.
        with_box_refine: iterative box refinement, one class and box head per decoder layer.
        two_stage: encoder proposals give the reference boxes and queries (needs box refinement,
            as in the published "++" model and HuggingFace).
        aux_loss: return every decoder layer's predictions but the last in ``aux_outputs``.
        decoder_norm: DINO's extra LayerNorm on the decoder outputs the heads predict from (its
            ``TransformerDecoder.norm``); the references passed between layers are still refined
            from the un-normalised outputs, as in DINO, so the predicted boxes then differ from
            the next layer's reference. Needs ``with_box_refine``.
        pos_temperature: temperature of the sine position embedding (DINO 20, Deformable DETR
            10000).
        pos_offset, inverse_sigmoid_eps, select_padded_proposals: the position embedding's offset,
            the refinement's clamp, and whether mixed selection may pick padded/border positions:
            DINO's code has 0, 1e-3, True (set by the DINO R50 models: docs/dino.md "DINO's
            official checkpoints"); Deformable DETR's 0.5, 1e-5 and (visiontf's choice) False.
    """

    hidden_dim: int = 256
    nheads: int = 8
    enc_layers: int = 6
    dec_layers: int = 6
    dim_feedforward: int = 1024
    dropout: float = 0.1
    num_queries: int = 300
    num_feature_levels: int = 4
    enc_n_points: int = 4
    dec_n_points: int = 4
    with_box_refine: bool = False
    two_stage: bool = False
    aux_loss: bool = True
    decoder_norm: bool = False
    pos_temperature: float = 10000.0
    pos_offset: float = 0.5
    inverse_sigmoid_eps: float = 1e-5
    select_padded_proposals: bool = False

    def __post_init__(self) -> None:
        """Refuse values and combinations that cannot build a working model, naming the argument and the fix."""
        for f in fields(self):
            value = getattr(self, f.name)
            expected = {"int": int, "float": (int, float), "bool": bool}[f.type]
            if not isinstance(value, expected) or (f.type != "bool" and isinstance(value, bool)):
                raise TypeError(f"{f.name} must be {'an' if f.type == 'int' else 'a'} {f.type}, got {value!r}")
        least = {"nheads": 1, "enc_layers": 0, "dec_layers": 1, "dim_feedforward": 1, "num_queries": 1,
                 "num_feature_levels": 1, "enc_n_points": 1, "dec_n_points": 1}
        for name, low in least.items():
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.hidden_dim % 32 or self.hidden_dim % self.nheads:
            raise ValueError(f"hidden_dim must be a multiple of 32 (GroupNorm(32)) and of nheads={self.nheads}, got {self.hidden_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.pos_temperature > 0:
            raise ValueError(f"pos_temperature must be > 0 (Deformable DETR 10000, DINO 20), got {self.pos_temperature}")
        if not 0.0 < self.inverse_sigmoid_eps < 0.5:
            raise ValueError(f"inverse_sigmoid_eps must be in (0, 0.5) (Deformable DETR 1e-5, DINO 1e-3), got {self.inverse_sigmoid_eps}")
        if self.two_stage and not self.with_box_refine:
            raise ValueError("two_stage=True needs with_box_refine=True (the published two-stage model refines boxes)")
        if self.decoder_norm and not self.with_box_refine:
            raise ValueError("decoder_norm=True (DINO) predicts refined boxes from normalised outputs: it needs with_box_refine=True")
