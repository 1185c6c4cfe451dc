#!/usr/bin/env python
"""Sample images from a trained VQGAN transformer (a TransformerTask checkpoint) into a grid PNG.

    python tools/sample.py --ckpt_path outputs/vqgan_transformer_tiny/checkpoints/last.ckpt --output samples.png \
        --num 16 --latent 8 8 --temperature 1.0 --top_k 100 --seed 0
    python tools/sample.py ... --label 3        # class-conditional: class 3 (default: the classes in turn)
"""
import sys
from pathlib import Path

from visiontf.cli.tool_errors import run_tool
from visiontf.core.arguments import ToolParser


def check_values(args) -> None:
    """Refuse, before torch is imported, option values no transformer can sample with (one line, exit code 2)."""
    import math

    from PIL import Image

    from visiontf.core.errors import UsageError

    if args.num < 1:
        raise UsageError(f"--num {args.num}: give the number of images to sample, >= 1")
    if args.latent is not None and min(args.latent) < 1:
        raise UsageError(f"--latent {args.latent[0]} {args.latent[1]}: the code grid needs >= 1 row and column")
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        raise UsageError(f"--temperature {args.temperature}: give a finite value > 0 (1.0 samples the model's own "
                         "distribution; lower is more conservative)")
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top_k {args.top_k}: keeps the k most likely codes; give k >= 1, or leave it out to keep all")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top_p {args.top_p}: a probability mass in (0, 1]; leave it out (or 1) to keep all codes")
    if args.output.is_dir():
        raise UsageError(f"--output {args.output}: a folder; give the grid's file name, e.g. {args.output / 'samples.png'}")
    if args.output.suffix.lower() not in Image.registered_extensions():
        raise UsageError(f"--output {args.output}: not an image file name; end it with .png (or .jpg)")


def main(argv=None) -> int:
    p = ToolParser(prog="sample.py", description=__doc__)
    p.add_argument("--ckpt_path", required=True, type=Path)
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--num", type=int, default=16)
    p.add_argument("--latent", type=int, nargs=2, default=None, help="code grid h w (default: the block size's square)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top_k", type=int, default=None)
    p.add_argument("--top_p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", type=int, default=None,
                   help="class-conditional checkpoints: the class to sample (default: 0, 1, ... in turn over the grid)")
    args = p.parse_args(argv)
    check_values(args)
    import math

    import torch
    from torchvision.utils import save_image

    from visiontf.core.errors import UsageError
    from visiontf.models.contract import Generator
    from visiontf.tasks.checkpoints import CheckpointError, load_checkpoint_model

    model, _ = load_checkpoint_model(args.ckpt_path)
    if not isinstance(model, Generator):
        raise CheckpointError(f"{args.ckpt_path}: not a second-stage (transformer) checkpoint; reconstruct with "
                              "tools/predict.py")
    model.eval()
    block, vocab = model.transformer.block_size, model.transformer.vocab_size
    h, w = args.latent or (int(math.isqrt(block)),) * 2
    # the conditioning token (start-of-sequence or class) is the first of the block; the last code is never fed back
    if h * w > block:
        side = int(math.isqrt(block))
        raise UsageError(f"--latent {h} {w}: {h * w} codes, but this transformer's block holds {block} (its "
                         f"block_size); give at most {block} codes, e.g. --latent {side} {side}")
    if args.top_k is not None and args.top_k > vocab:
        raise UsageError(f"--top_k {args.top_k}: the codebook has {vocab} codes; give 1..{vocab}, or leave it out")
    gen = torch.Generator().manual_seed(args.seed)
    labels = None
    if model.n_classes is None:
        if args.label is not None:
            raise UsageError(f"--label {args.label}: {args.ckpt_path} is an unconditional transformer; drop --label")
    elif args.label is None:
        labels = torch.arange(args.num) % model.n_classes
    elif not 0 <= args.label < model.n_classes:
        raise UsageError(f"--label {args.label}: this transformer has classes 0..{model.n_classes - 1}")
    else:
        labels = torch.full((args.num,), args.label)
    codes = model.sample(args.num, (h, w), labels=labels, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, generator=gen)
    images = (model.decode_to_img(codes).clamp(-1, 1) + 1) / 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    save_image(images, args.output, nrow=int(math.ceil(math.sqrt(args.num))), padding=2)
    print(f"{args.num} samples ({h}x{w} codes) -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, prog="sample.py"))
