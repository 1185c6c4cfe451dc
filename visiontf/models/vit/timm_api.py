"""The ViT methods timm users reach for, with timm's signatures and arithmetic.

:class:`TimmViTApi` is mixed into :class:`~visiontf.models.vit.vit.VisionTransformer`:

* ``feature_info``: one entry per block (``module="blocks.i"``, ``num_chs``, ``reduction`` = the
  patch), what timm's feature wrappers read;
* :meth:`~TimmViTApi.forward_intermediates` and :meth:`~TimmViTApi.prune_intermediate_layers`: timm's
  ``VisionTransformer`` methods, so that ``features_only=True`` wraps the model in timm's own
  ``FeatureGetterNet`` (:func:`visiontf.models.vit.features.features_only`);
* :meth:`~TimmViTApi.set_input_size`: a new image (and patch) size, ``pos_embed`` resampled in place.

The ViT's embedding (``_embed``: patches, prefix tokens, position table, which ``dynamic_img_size``
resamples per input) and blocks are the model's own; these methods only walk them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from visiontf.nn import resample_pos_embed
from visiontf.nn.patch_embed import to_pair


def take_indices(num_blocks: int, indices: int | Sequence[int] | None) -> list[int]:
    """timm's ``feature_take_indices``: None -> every block, an int n -> the last n, a sequence -> those
    (negative from the end); an index out of range is one line naming the valid ones."""
    if indices is None:
        indices = num_blocks
    if isinstance(indices, int):
        if not 0 < indices <= num_blocks:
            raise ValueError(f"last-n indices={indices} is out of range: this ViT has {num_blocks} blocks (use 1..{num_blocks})")
        return list(range(num_blocks - indices, num_blocks))
    taken = [num_blocks + int(i) if int(i) < 0 else int(i) for i in indices]
    bad = [i for i, t in zip(indices, taken) if not 0 <= t < num_blocks]
    if bad or not taken:
        raise ValueError(
            f"block indices {tuple(indices)} do not fit a ViT of {num_blocks} blocks: use 0..{num_blocks - 1} "
            f"(or -{num_blocks}..-1 from the end)"
        )
    return taken


class TimmViTApi:
    """timm's ``forward_intermediates`` / ``prune_intermediate_layers`` / ``set_input_size`` for visiontf's ViT."""

    blocks: nn.ModuleList
    norm: nn.Module
    num_prefix_tokens: int

    @property
    def feature_info(self) -> list[dict]:
        """timm's per-block feature description: module name, channels, stride (the patch)."""
        reduction = max(self.patch_embed.patch_size)
        return [dict(module=f"blocks.{i}", num_chs=self.embed_dim, reduction=reduction) for i in range(len(self.blocks))]

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        output_dict: bool = False,
    ) -> list | tuple[Tensor, list] | dict:
        """timm's ``VisionTransformer.forward_intermediates``: the tokens of the chosen blocks.

        Args:
            indices: 0-based block indices (negative from the end), an int n for the last n, None for all.
            return_prefix_tokens: each intermediate as (map, prefix tokens (B, prefix, C)).
            norm: apply the final norm to each intermediate.
            stop_early: stop after the last chosen block (then the final features are not computed).
            output_fmt: ``"NCHW"`` maps (B, C, h, w) or ``"NLC"`` tokens (B, h * w, C).
            intermediates_only: return the list only; else ``(final normalised tokens, list)``.
            output_dict: ``{"image_intermediates", "image_features"?, "image_intermediates_prefix"?}``.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r}: a ViT gives 'NCHW' maps or 'NLC' tokens")
        take = take_indices(len(self.blocks), indices)
        B = x.shape[0]
        x, (h, w) = self._embed(x)
        last = max(take) + 1 if (stop_early or intermediates_only) else len(self.blocks)
        taken = []
        for i, blk in enumerate(self.blocks[:last]):
            x = blk(x)[0]
            if i in take:
                taken.append((i, self.norm(x) if norm else x))
        # in the order asked for, as timm's (which appends in block order: the same for sorted indices)
        by_index = dict(taken)
        outs = [by_index[i] for i in sorted(set(take))]
        p = self.num_prefix_tokens
        prefix = [y[:, :p] for y in outs]
        outs = [y[:, p:] for y in outs]
        if output_fmt == "NCHW":
            outs = [y.reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous() for y in outs]
        if output_dict:
            result = {"image_intermediates": outs}
            if return_prefix_tokens:
                result["image_intermediates_prefix"] = prefix
            if not intermediates_only:
                result["image_features"] = self.norm(x)
            return result
        if return_prefix_tokens:
            outs = list(zip(outs, prefix))
        if intermediates_only:
            return outs
        return self.norm(x), outs

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the blocks after the last of ``indices`` (and the final norm, the heads); returns the
        absolute indices kept (timm's contract, read by its ``FeatureGetterNet``)."""
        take = take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max(take) + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0)
        return take

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: int | tuple[int, int] | None = None) -> None:
        """timm's ``set_input_size``: a new nominal image size (and patch size), ``pos_embed`` resampled
        bicubically (antialiased) to the new grid in place; ``pretrained_cfg.input_size`` follows."""
        old_grid = self.patch_embed.grid_size
        self.patch_embed.set_input_size(img_size, patch_size)
        new_grid = self.patch_embed.grid_size
        if new_grid != old_grid:
            with torch.no_grad():
                table = resample_pos_embed(self.pos_embed.data, old_grid, new_grid, self.num_prefix_tokens)
            self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)
        c = self.pretrained_cfg.input_size[0] if self.pretrained_cfg.input_size else 3
        self.pretrained_cfg = dataclasses.replace(self.pretrained_cfg, input_size=(c, *to_pair(self.patch_embed.img_size)))
