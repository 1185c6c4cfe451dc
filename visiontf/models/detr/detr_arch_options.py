"""DETR's architecture as one typed, checked object: the ``arch`` section of its configs."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DetrArchOptions"]


@dataclass(frozen=True)
class DetrArchOptions:
    """The transformer and heads of :class:`~visiontf.models.detr.detr.DETR` (the original's defaults).

    Args:
        hidden_dim, nheads, enc_layers, dec_layers, dim_feedforward, dropout: the transformer's.
        num_queries: object queries (detections per image).
        position_embedding: ``"sine"`` (the published models') or ``"learned"``.
        aux_loss: every decoder layer's predictions go to the loss.
    """

    hidden_dim: int = 256
    nheads: int = 8
    enc_layers: int = 6
    dec_layers: int = 6
    dim_feedforward: int = 2048
    dropout: float = 0.1
    num_queries: int = 100
    position_embedding: str = "sine"
    aux_loss: bool = True

    def __post_init__(self) -> None:
        if self.hidden_dim % 2:
            raise ValueError(f"hidden_dim must be even for the 2D position embedding, got {self.hidden_dim}")
        if self.position_embedding not in ("sine", "v2", "learned", "v3"):
            raise ValueError(f"position_embedding must be 'sine' or 'learned', got {self.position_embedding!r}")
