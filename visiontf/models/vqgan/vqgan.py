"""VQGAN's first stage (Esser et al., "Taming Transformers", 2021): an image tokenizer.

:class:`VQModel` is the model part of taming's ``taming.models.vqgan.VQModel`` (encoder,
``quant_conv``, ``VectorQuantizer2``, ``post_quant_conv``, decoder) with taming's state-dict keys;
the training loss (``loss.*``: LPIPS and the patch discriminator) is not part of it.
Images are (B, 3, H, W) in [-1, 1] (``x / 127.5 - 1``, as taming feeds them).

* ``model(x)``: the reconstruction, (B, 3, H, W) (``return_loss=True``: ``(x_rec, codebook_loss)``,
  taming's ``forward``). Sizes that are not multiples of ``downsample_factor`` are padded at the
  bottom and right by repeating the border pixels and the reconstruction is cropped back.
* ``model.encode(x)`` -> ``(quant, emb_loss, (perplexity, None, indices))`` (taming's triple);
  ``model.decode(quant)``; ``model.tokenize(x)`` -> code indices (B, h, w);
  ``model.detokenize(indices)`` -> images. ``tokenize`` needs H, W divisible by the factor.

Taming's Lightning ``.ckpt`` files load with ``create_model(name, pretrained="last.ckpt")``:
:func:`convert_state_dict` drops ``loss.*`` and refuses weights of another shape, naming the
registered model they fit. See docs/generation.md.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models._registry import WeightsLayoutError, register_model
from visiontf.models.contract import ModelCfg, PretrainedCfg, Tokenizer
from visiontf.models.vqgan.blocks import Decoder, Encoder
from visiontf.models.vqgan.build import build_vqgan
from visiontf.models.vqgan.quantize import VectorQuantizer2

log = logging.getLogger(__name__)


class VQModel(Tokenizer):
    """VQGAN autoencoder: ``encoder`` -> ``quant_conv`` -> ``quantize`` -> ``post_quant_conv`` -> ``decoder``.

    Args (taming's ``ddconfig`` plus ``n_embed``/``embed_dim``):
        n_embed: codebook size (``num_codes``).
        embed_dim: width of a code (``quant_conv`` maps ``z_channels`` to it).
        ch, ch_mult, num_res_blocks, attn_resolutions, resolution, z_channels, dropout: see
            :class:`~visiontf.models.vqgan.blocks.Encoder`; ``resolution`` only places the attention
            blocks (any image size runs).
        beta, legacy: see :class:`~visiontf.models.vqgan.quantize.VectorQuantizer2`.
        norm_groups: GroupNorm's group count (taming: 32; see :mod:`~visiontf.models.vqgan.blocks` for why a
            small model keeps colours better with fewer).
        quantizer_kwargs: the quantiser's training options beyond taming (k-means initialisation, dead-code
            restarts, l2-normalised codes, EMA codebook), all off by default; see
            :mod:`visiontf.models.vqgan.quantize`.
        pretrained_cfg: eval settings over those the arguments give (taming's [-1, 1] input, ``resolution``).
    """

    def __init__(self, n_embed: int = 1024, embed_dim: int = 256, ch: int = 128,
                 ch_mult: Sequence[int] = (1, 1, 2, 2, 4), num_res_blocks: int = 2,
                 attn_resolutions: Sequence[int] = (16,), resolution: int = 256, z_channels: int = 256,
                 in_channels: int = 3, out_ch: int = 3, dropout: float = 0.0, beta: float = 0.25,
                 legacy: bool = True, quantizer_kwargs: dict | None = None, norm_groups: int = 32,
                 pretrained_cfg: PretrainedCfg | Mapping[str, Any] | None = None) -> None:
        super().__init__()
        dd = dict(ch=ch, ch_mult=tuple(ch_mult), num_res_blocks=num_res_blocks, attn_resolutions=tuple(attn_resolutions),
                  resolution=resolution, z_channels=z_channels, dropout=dropout, norm_groups=norm_groups)
        self.encoder = Encoder(in_channels=in_channels, double_z=False, **dd)
        self.decoder = Decoder(out_ch=out_ch, **dd)
        self.quantize = VectorQuantizer2(n_embed, embed_dim, beta=beta, legacy=legacy, **(quantizer_kwargs or {}))
        self.quant_conv = nn.Conv2d(z_channels, embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(embed_dim, z_channels, 1)
        self.num_codes = n_embed
        self.embed_dim = embed_dim
        self.downsample_factor = 2 ** (len(ch_mult) - 1)
        self.in_channels = in_channels
        self.pretrained_cfg = PretrainedCfg(
            input_size=(in_channels, resolution, resolution),
            # taming: x / 127.5 - 1, i.e. (x / 255 - 0.5) / 0.5
            mean=(0.5,) * in_channels, std=(0.5,) * in_channels,
            crop_pct=1.0, interpolation="bilinear",  # shortest side resized to `resolution`, then a centre crop
            num_codes=n_embed, downsample_factor=self.downsample_factor,
        ).merged(pretrained_cfg)

    # ------------------------------------------------------------------ taming's API
    def encode(self, x: Tensor) -> tuple[Tensor, Tensor, tuple]:
        """Images (B, 3, H, W) in [-1, 1] -> ``(quant (B, embed_dim, h, w), codebook loss,
        (perplexity, None, indices (B*h*w,)))``."""
        self._check_images(x)
        return self.quantize(self.quant_conv(self.encoder(x)))

    def encode_to_prequant(self, x: Tensor) -> Tensor:
        """The latents before quantisation, (B, embed_dim, h, w)."""
        self._check_images(x)
        return self.quant_conv(self.encoder(x))

    def decode(self, quant: Tensor) -> Tensor:
        """Quantised latents (B, embed_dim, h, w) -> images (B, 3, h * f, w * f)."""
        return self.decoder(self.post_quant_conv(quant))

    def forward(self, x: Tensor, return_loss: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Reconstruct images (B, 3, H, W) in [-1, 1]; any H, W (padded to a multiple of
        ``downsample_factor`` by repeating the last row/column, cropped back afterwards)."""
        self._check_images(x)
        H, W = x.shape[-2:]
        f = self.downsample_factor
        pad_h, pad_w = -H % f, -W % f
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h), mode="replicate")
        quant, diff, _ = self.quantize(self.quant_conv(self.encoder(x)))
        dec = self.decode(quant)[..., :H, :W]
        return (dec, diff) if return_loss else dec

    # ------------------------------------------------------------------ tokens
    def tokenize(self, x: Tensor) -> Tensor:
        """Images (B, 3, H, W) in [-1, 1], H and W multiples of ``downsample_factor`` -> code indices (B, h, w)."""
        self._check_images(x)
        H, W = x.shape[-2:]
        f = self.downsample_factor
        if H % f or W % f:
            raise ValueError(f"tokenize needs H and W divisible by the downsampling factor {f}, got {H}x{W}; "
                             f"resize or crop to {H - H % f or f}x{W - W % f or f} (model(x) pads and crops itself)")
        return self.quantize.codes(self.quant_conv(self.encoder(x)))

    def detokenize(self, indices: Tensor) -> Tensor:
        """Code indices (B, h, w) -> images (B, 3, h * f, w * f) in about [-1, 1]."""
        if indices.dim() != 3:
            raise ValueError(f"expected code indices of shape (B, h, w), got {tuple(indices.shape)}")
        return self.decode(self.quantize.lookup(indices))

    def decode_code(self, indices: Tensor) -> Tensor:
        """taming's name for :meth:`detokenize`."""
        return self.detokenize(indices)

    def last_layer(self) -> Tensor:
        """The decoder's last weight, where taming's adaptive GAN weight compares gradient norms."""
        return self.decoder.conv_out.weight

    def _check_images(self, x: Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"expected images of shape (B, {self.in_channels}, H, W), got {tuple(x.shape)}")
        if not torch.isfinite(x).all():
            raise ValueError("the images hold NaN or infinite values; VQGAN expects finite pixels in [-1, 1]")


# ---------------------------------------------------------------------------------------- checkpoints
#: tensors of a taming checkpoint that are not the autoencoder's (LPIPS and the discriminator)
_TRAINING_ONLY = ("loss.",)


def convert_state_dict(state: dict[str, Tensor], model: VQModel) -> dict[str, Tensor]:
    """A taming / latent-diffusion VQGAN state dict (or visiontf's own) for ``model``.

    ``loss.*`` (LPIPS and discriminator weights) is dropped: it trains the model and plays no part
    in encoding or decoding. A ``Net2NetTransformer`` checkpoint gives its ``first_stage_model.*``.
    Weights of another shape (a codebook of another size, another ``ch_mult``) are refused with a
    :class:`WeightsLayoutError` that names the registered model they fit, if one does.
    """
    state = dict(state)
    if any(k.startswith("first_stage_model.") for k in state):
        others = sorted({k.split(".")[0] for k in state if not k.startswith("first_stage_model.")})
        log.info("taking the first stage (first_stage_model.*) of a Net2NetTransformer checkpoint; ignored: %s", others)
        state = {k[len("first_stage_model."):]: v for k, v in state.items() if k.startswith("first_stage_model.")}
    dropped = [k for k in state if k.startswith(_TRAINING_ONLY)]
    if dropped:
        log.info("ignored %d loss.* tensors (LPIPS and discriminator weights: training only, not used for inference)",
                 len(dropped))
    ema = [k for k in state if k.startswith("model_ema.")]
    if ema:
        log.warning("ignored %d model_ema.* tensors: the model's own (non-EMA) weights are loaded", len(ema))
    state = {k: v for k, v in state.items() if not k.startswith(_TRAINING_ONLY) and not k.startswith("model_ema.")}
    own = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (model: {tuple(own[k].shape)})" for k, v in state.items()
             if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        name = model.model_name or type(model).__name__
        book = state.get("quantize.embedding.weight")
        what = (f"a codebook of {book.shape[0]} codes x {book.shape[1]} (the model has {model.num_codes} x "
                f"{model.embed_dim})" if book is not None and tuple(book.shape) != tuple(own["quantize.embedding.weight"].shape)
                else f"{len(wrong)} tensors of another shape, e.g. {wrong[:3]}")
        fits = registered_fits(state)
        only_book = book is not None and not [w for w in wrong if not w.startswith("quantize.embedding.weight ")]
        hint = (f" They fit {', '.join(fits)}: create_model({fits[0]!r}, pretrained=...)." if fits
                else f" Build the model with n_embed={book.shape[0]}, embed_dim={book.shape[1]} (a config's model_kwargs: "
                     f"{{n_embed: {book.shape[0]}, embed_dim: {book.shape[1]}}}) to load them, or train this codebook "
                     "from scratch." if only_book
                else " No registered VQGAN has this layout; build VQModel with the checkpoint's ddconfig, n_embed and embed_dim.")
        raise WeightsLayoutError(f"the weights do not fit {name}: they hold {what}.{hint}")
    return state


def registered_fits(state: dict[str, Tensor]) -> list[str]:
    """Registered VQGAN names whose every tensor has the shape ``state`` gives it (built on the meta device)."""
    fits = []
    for name, variant in DEFAULT_CFGS.items():
        with torch.device("meta"):
            own = VQModel(**variant.kwargs).state_dict()
        if set(own) <= set(state) and all(tuple(state[k].shape) == tuple(t.shape) for k, t in own.items()):
            fits.append(name)
    return fits


# ---------------------------------------------------------------------------------------- registry
_TAMING = "https://heibox.uni-heidelberg.de/d/"
_LDM = "https://ommer-lab.com/files/latent-diffusion/"
_F16 = dict(embed_dim=256, ch=128, ch_mult=(1, 1, 2, 2, 4), num_res_blocks=2, attn_resolutions=(16,), resolution=256,
            z_channels=256)
# latent-diffusion models/first_stage_models/vq-f8*/config.yaml: attention at 32 = 256 / 8, the lowest resolution
_F8 = dict(embed_dim=4, ch=128, ch_mult=(1, 2, 2, 4), num_res_blocks=2, attn_resolutions=(32,), resolution=256,
           z_channels=4)

#: ``url``: where the weights are published (folder shares and zip archives: pretrained=True is refused, this says where)
DEFAULT_CFGS: dict[str, ModelCfg] = {
    "vqgan_imagenet_f16_1024": ModelCfg(dict(n_embed=1024, **_F16), PretrainedCfg(url=_TAMING + "8088892a516d4e3baf92/")),
    "vqgan_imagenet_f16_16384": ModelCfg(dict(n_embed=16384, **_F16), PretrainedCfg(url=_TAMING + "a7530b09fed84f80a887/")),
    "vq_f8": ModelCfg(dict(n_embed=16384, **_F8), PretrainedCfg(url=_LDM + "vq-f8.zip")),
    "vq_f8_n256": ModelCfg(dict(n_embed=256, **_F8), PretrainedCfg(url=_LDM + "vq-f8-n256.zip")),
    # CPU-sized, f8: 4 levels of 32-64 channels, attention at the lowest resolution (8 for 64 px images)
    "vqgan_tiny": ModelCfg(dict(n_embed=512, embed_dim=32, ch=32, ch_mult=(1, 1, 2, 2), num_res_blocks=1,
                                attn_resolutions=(8,), resolution=64, z_channels=32)),
}

_TAGS = ("generation", "vqgan")


#: the registry-wide test's settings: two levels of 32 channels, one attention, 16 codes of 8, on 16-px images
_TEST = dict(test_kwargs=dict(n_embed=16, embed_dim=8, ch=32, ch_mult=(1, 1), num_res_blocks=1, attn_resolutions=(8,),
                              resolution=16, z_channels=8), test_image_size=(16, 16))


def _create(name: str, **kwargs) -> VQModel:
    return build_vqgan(VQModel, DEFAULT_CFGS[name], **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def vqgan_imagenet_f16_1024(**kwargs) -> VQModel:
    """taming's ImageNet VQGAN, f16, 1024 codes of 256 (rFID 7.94 on ImageNet val; 72.14 M parameters)."""
    return _create("vqgan_imagenet_f16_1024", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def vqgan_imagenet_f16_16384(**kwargs) -> VQModel:
    """taming's ImageNet VQGAN, f16, 16384 codes of 256 (rFID 4.98 on ImageNet val; 76.07 M parameters)."""
    return _create("vqgan_imagenet_f16_16384", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def vq_f8(**kwargs) -> VQModel:
    """latent-diffusion's OpenImages VQGAN ``vq-f8``: f8, 16384 codes of 4 (rFID 1.14 on ImageNet val)."""
    return _create("vq_f8", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def vq_f8_n256(**kwargs) -> VQModel:
    """latent-diffusion's OpenImages VQGAN ``vq-f8-n256``: f8, 256 codes of 4."""
    return _create("vq_f8_n256", **kwargs)


@register_model(filter_fn=convert_state_dict, tags=_TAGS, **_TEST)
def vqgan_tiny(**kwargs) -> VQModel:
    """A small f8 VQGAN for the CPU: channels 32-64, one ResNet block per level, 512 codes of 32."""
    return _create("vqgan_tiny", **kwargs)
