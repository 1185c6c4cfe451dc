"""VQGAN's second stage: taming's minGPT over first-stage code indices (``Net2NetTransformer``).

:class:`GPT` has the layout of ``taming/modules/transformer/mingpt.py`` (``tok_emb``, ``pos_emb``
of shape (1, block_size, n_embd) left at zeros as there, ``drop``, ``blocks.{i}.{ln1,ln2}``,
``blocks.{i}.attn.{key,query,value,proj}``, ``blocks.{i}.mlp.{0,2}`` with GELU and a 4x width,
``ln_f``, ``head`` without bias; Linear/Embedding weights N(0, 0.02), biases 0). Causal attention
runs on ``scaled_dot_product_attention``; taming's (block_size x block_size) ``attn.mask`` buffers
are not kept (:func:`convert_state_dict` checks and drops them).

:class:`Net2NetTransformer` holds a frozen ``first_stage_model`` (:class:`VQModel`) and the
``transformer``, with taming's keys (``first_stage_model.*``, ``transformer.*``). Conditioning is
one token in front of the image codes, in the same vocabulary: the SOS token (``sos_token``,
unconditional, taming's ``SOSProvider``) or the class label (class-conditional, taming's
``Labelator``). Sampling is batched, with temperature, top-k and top-p, and a KV cache so that
each new token costs one step of the transformer.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from visiontf.models._registry import WeightsLayoutError, register_model
from visiontf.models.contract import Generator, ModelCfg, PretrainedCfg
from visiontf.models.vqgan.build import build_vqgan_transformer
from visiontf.models.vqgan.vqgan import VQModel
from visiontf.nn.attention import scaled_dot_product_attention

log = logging.getLogger(__name__)


class KVCache:
    """Keys and values of every layer for ``max_len`` positions, filled left to right."""

    def __init__(self, n_layer: int, batch: int, n_head: int, max_len: int, head_dim: int, like: Tensor) -> None:
        self.k = like.new_zeros(n_layer, batch, n_head, max_len, head_dim)
        self.v = like.new_zeros(n_layer, batch, n_head, max_len, head_dim)
        self.length = 0  # positions filled (all layers alike, advanced by GPT.forward)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate ``key``/``query``/``value`` Linears and ``proj``."""

    def __init__(self, n_embd: int, n_head: int, attn_pdrop: float = 0.0, resid_pdrop: float = 0.0, n_unmasked: int = 0) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd {n_embd} is not divisible by n_head {n_head}")
        self.key = nn.Linear(n_embd, n_embd)
        self.query = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
        self.attn_pdrop = attn_pdrop
        self.resid_drop = nn.Dropout(resid_pdrop)
        self.proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.n_unmasked = n_unmasked  # taming: the first n_unmasked positions see each other

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        """(B, T, C) -> (B, T, C); with ``cache``, x holds positions ``cache.length ...`` and attends to all before."""
        B, T, C = x.shape
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        start = 0
        if cache is not None:
            start = cache.length
            cache.k[layer, :, :, start : start + T] = k
            cache.v[layer, :, :, start : start + T] = v
            k, v = cache.k[layer, :, :, : start + T], cache.v[layer, :, :, : start + T]
        mask = None
        if self.n_unmasked > 0 or (start > 0 and T > 1):
            rows = torch.arange(start, start + T, device=x.device)[:, None]
            cols = torch.arange(start + T, device=x.device)[None, :]
            mask = (cols <= rows) | ((rows < self.n_unmasked) & (cols < self.n_unmasked))
        is_causal = bool(mask is None and start == 0 and T > 1)  # a Python bool also when traced (ONNX)
        y = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                         dropout_p=self.attn_pdrop if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class Block(nn.Module):
    """Pre-norm block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, n_embd: int, n_head: int, attn_pdrop: float, resid_pdrop: float, n_unmasked: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, attn_pdrop, resid_pdrop, n_unmasked)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(resid_pdrop))

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        x = x + self.attn(self.ln1(x), cache, layer)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """taming's minGPT: token ids (B, T) -> logits (B, T, vocab_size)."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int = 12, n_head: int = 8, n_embd: int = 256,
                 embd_pdrop: float = 0.0, resid_pdrop: float = 0.0, attn_pdrop: float = 0.0, n_unmasked: int = 0) -> None:
        super().__init__()
        self.vocab_size, self.block_size = vocab_size, block_size
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, block_size, n_embd))
        self.drop = nn.Dropout(embd_pdrop)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, attn_pdrop, resid_pdrop, n_unmasked) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def no_weight_decay(self) -> set[str]:
        """taming's AdamW groups: only Linear weights decay (biases, LayerNorm, Embedding and ``pos_emb`` do not)."""
        return {n for n, _ in self.named_parameters() if not (n.endswith("weight") and isinstance(
            self.get_submodule(n.rsplit(".", 1)[0]) if "." in n else self, nn.Linear))}

    def forward(self, idx: Tensor, embeddings: Tensor | None = None, targets: Tensor | None = None,
                cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, vocab) of ``idx`` (B, T) (``embeddings`` (B, E, n_embd) prepended, as taming), and the
        cross-entropy against ``targets`` (B, T) when given. With ``cache``, ``idx`` continues the cached positions."""
        x = self.tok_emb(idx)
        if embeddings is not None:
            x = torch.cat((embeddings, x), dim=1)
        start = cache.length if cache is not None else 0
        t = x.shape[1]
        if start + t > self.block_size:
            raise ValueError(f"sequence of {start + t} tokens exceeds the block size {self.block_size}")
        x = self.drop(x + self.pos_emb[:, start : start + t])
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i)
        if cache is not None:
            cache.length += t
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        p = self.head.weight
        return KVCache(self.n_layer, batch, self.n_head, max_len or self.block_size, self.n_embd // self.n_head, p)

    @torch.no_grad()
    def generate(self, idx: Tensor, steps: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, greedy: bool = False, generator: torch.Generator | None = None,
                 use_cache: bool = True) -> Tensor:
        """Continue ``idx`` (B, T0) by ``steps`` tokens -> (B, steps). With the cache, the prompt is one
        forward and each new token one step of length 1; without it, every step reruns the whole sequence."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature} (greedy=True takes the most likely token)")
        if idx.shape[1] + steps - 1 > self.block_size:
            raise ValueError(f"{idx.shape[1]} conditioning + {steps} sampled tokens exceed the block size {self.block_size}")
        cache = self.new_cache(idx.shape[0], idx.shape[1] + steps) if use_cache else None
        seq, step_in = idx, idx
        for _ in range(steps):
            logits, _ = self(step_in if use_cache else seq, cache=cache)
            logits = filter_logits(logits[:, -1, :] / temperature, top_k, top_p)
            if greedy:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)
            seq = torch.cat((seq, nxt), dim=1)
            step_in = nxt
        return seq[:, idx.shape[1]:]


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """(B, V) logits with all but the ``top_k`` largest, then all outside the smallest set whose
    probability exceeds ``top_p`` (always keeping the most likely), set to -inf."""
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cum > top_p
        remove[..., 1:] = remove[..., :-1].clone()  # keep the token that crosses top_p
        remove[..., 0] = False
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits


class Net2NetTransformer(Generator):
    """A first stage (:class:`VQModel`, frozen, eval) and a :class:`GPT` over its codes, one conditioning token first.

    Args:
        first_stage: the built :class:`VQModel` (a registered name: :func:`~visiontf.models.vqgan.build.build_vqgan_transformer`).
        n_classes: None: unconditional (``sos_token`` first); an int: class-conditional (the label first,
            in [0, n_classes), sharing the vocabulary with the codes).
        pkeep: training only: the probability of keeping each input code (else a random one), taming's.
        gpt: :class:`GPT` arguments; ``vocab_size`` defaults to the first stage's ``num_codes``.
    """

    def __init__(self, first_stage: VQModel, n_classes: int | None = None, sos_token: int = 0, pkeep: float = 1.0, **gpt) -> None:
        super().__init__()
        self.first_stage_model = first_stage.eval().requires_grad_(False)
        # its images are its first stage's: their size and value range
        first = first_stage.pretrained_cfg
        self.pretrained_cfg = PretrainedCfg(input_size=first.input_size, mean=first.mean, std=first.std,
                                            num_codes=first.num_codes, downsample_factor=first.downsample_factor)
        gpt.setdefault("vocab_size", first_stage.num_codes)
        self.transformer = GPT(**gpt)
        if n_classes is not None and n_classes > self.transformer.vocab_size:
            raise ValueError(f"{n_classes} classes do not fit a vocabulary of {self.transformer.vocab_size} tokens")
        self.n_classes, self.sos_token, self.pkeep = n_classes, sos_token, pkeep

    def train(self, mode: bool = True) -> Net2NetTransformer:
        super().train(mode)
        self.first_stage_model.eval()  # taming's disabled_train: the first stage never leaves eval
        return self

    def no_weight_decay(self) -> set[str]:
        """Parameters AdamW leaves undecayed (taming: all but the transformer's Linear weights; the first stage is frozen)."""
        return {f"transformer.{n}" for n in self.transformer.no_weight_decay()}

    def cond_tokens(self, batch: int, labels: Tensor | None = None, device=None) -> Tensor:
        """(B, 1): the SOS token, or the class labels."""
        if self.n_classes is None:
            return torch.full((batch, 1), self.sos_token, dtype=torch.long, device=device)
        if labels is None:
            raise ValueError("a class-conditional transformer needs the class labels")
        return labels.long().view(batch, 1).to(device)

    @torch.no_grad()
    def encode_to_z(self, x: Tensor) -> Tensor:
        """Images (B, 3, H, W) in [-1, 1] -> code indices (B, h*w) in raster order."""
        return self.first_stage_model.tokenize(x).flatten(1)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """taming's training step: ``(logits (B, h*w, vocab), target codes (B, h*w))``."""
        z = self.encode_to_z(x)
        c = self.cond_tokens(z.shape[0], labels, z.device)
        a = z
        if self.training and self.pkeep < 1.0:
            keep = torch.bernoulli(self.pkeep * torch.ones_like(z, dtype=torch.float)).round().long()
            a = keep * z + (1 - keep) * torch.randint_like(z, self.transformer.vocab_size)
        logits, _ = self.transformer(torch.cat((c, a), dim=1)[:, :-1])
        return logits[:, c.shape[1] - 1:], z

    @torch.no_grad()
    def sample(self, batch: int, latent_shape: tuple[int, int], labels: Tensor | None = None, **kwargs) -> Tensor:
        """Code indices (B, h, w), one token at a time; ``kwargs`` go to :meth:`GPT.generate`
        (temperature, top_k, top_p, greedy, generator, use_cache)."""
        h, w = latent_shape
        c = self.cond_tokens(batch, labels, self.transformer.head.weight.device)
        return self.transformer.generate(c, h * w, **kwargs).view(batch, h, w)

    @torch.no_grad()
    def decode_to_img(self, indices: Tensor) -> Tensor:
        """Code indices (B, h, w) -> images (B, 3, h*f, w*f)."""
        return self.first_stage_model.detokenize(indices)


def convert_state_dict(state: dict[str, Tensor], model: Net2NetTransformer) -> dict[str, Tensor]:
    """A taming ``Net2NetTransformer`` checkpoint: ``transformer.blocks.{i}.attn.mask`` (the causal mask taming
    stores) is checked and dropped, the first stage's ``loss.*`` too; everything else keeps its name."""
    state = {k: v for k, v in state.items() if not k.startswith("first_stage_model.loss.")}
    n_unmasked = model.transformer.blocks[0].attn.n_unmasked if len(model.transformer.blocks) else 0
    for key in [k for k in state if k.startswith("transformer.blocks.") and k.endswith(".attn.mask")]:
        mask = state.pop(key)
        size = mask.shape[-1]
        want = torch.ones(size, size).tril()
        want[:n_unmasked, :n_unmasked] = 1
        if mask.shape != (1, 1, size, size) or not torch.equal(mask.reshape(size, size).float().cpu(), want):
            raise WeightsLayoutError(f"{key} is not the causal mask of n_unmasked={n_unmasked}; build the model "
                                     "with the checkpoint's n_unmasked")
    book = state.get("transformer.tok_emb.weight")
    if book is not None and book.shape[0] != model.transformer.vocab_size:
        raise WeightsLayoutError(f"the checkpoint's transformer has a vocabulary of {book.shape[0]} tokens, the model "
                                 f"{model.transformer.vocab_size}; pick the first stage with that many codes")
    return state


#: a CPU-sized second stage over vqgan_tiny's 512 codes (8x8 codes for 64 px images)
DEFAULT_CFGS: dict[str, ModelCfg] = {
    "vqgan_transformer_tiny": ModelCfg(dict(first_stage="vqgan_tiny", block_size=64, n_layer=4, n_head=4, n_embd=128)),
}


#: the registry-wide test's settings: one block of 32 over a first stage of 16 codes (4x4 codes of 16-px images)
_TEST = dict(test_kwargs=dict(n_layer=1, n_head=2, n_embd=32, block_size=16,
                              first_stage_kwargs=dict(n_embed=16, embed_dim=8, ch=32, ch_mult=(1, 1, 1), num_res_blocks=1,
                                                      attn_resolutions=(4,), resolution=16, z_channels=8)),
             test_image_size=(16, 16))


@register_model(filter_fn=convert_state_dict, tags=("generation", "vqgan"), **_TEST)
def vqgan_transformer_tiny(**kwargs) -> Net2NetTransformer:
    """minGPT (4 layers, 4 heads, 128 wide) over ``vqgan_tiny``'s codes; ``n_classes=K`` for class-conditional."""
    return build_vqgan_transformer(Net2NetTransformer, DEFAULT_CFGS["vqgan_transformer_tiny"], **kwargs)
