"""Benchmark: CPU latency per image of RT-DETR, RT-DETRv2 and D-FINE against HF transformers on the same weights.

Each model is built at its published size in transformers (``RTDetrForObjectDetection``, ``RTDetrV2ForObjectDetection``,
``DFineForObjectDetection``; the config is read off visiontf's variant: widths, levels, points, layers) with random
weights, and visiontf's variant loads transformers' state dict through the family's converter
(``create_model(name, pretrained=file)``, as a user loads a transformers checkpoint). Rows, batch 1 at 640 x 640
(``--quick``: 320 x 320), ``--threads`` intra-op threads (default 1 and 2):

* ``eager``: visiontf's model in eval mode under ``inference_mode`` against transformers' (ratio = HF / ours,
  > 1: ours faster). ``fused``: the same after ``visiontf.models.rtdetr.deploy.fuse_for_inference`` (every
  BatchNorm folded into its convolution, the encoder's RepVGG blocks re-parameterised into one 3x3 convolution each,
  the frozen BatchNorms baked in: what deployment runs). transformers' model runs as transformers gives it.
* ``onnxruntime``: visiontf's exported graph (dynamic batch and size, ``visiontf.inference.export.export_onnx``,
  which exports the fused form) run by onnxruntime's CPU provider (``ORT_ENABLE_ALL``) against the same
  transformers model.

``same_result``: at least 90% of the queries' logits and boxes equal transformers' within 1e-3 (random weights,
whose near-equal encoder scores float32 reordering may swap in the top-k; :func:`agreement`).
All paths are timed in one process, alternating one call each per repeat (:func:`time_both`), so other load on a
shared machine hits all of them alike; medians of the wall time (the table's ratio) and of the calling thread's CPU
time (``cpu_ratio``, what the machine's other jobs disturb least; onnxruntime runs in the calling thread at one
intra-op thread; with more threads the pools' other threads go uncounted, so read it at one thread), with each path's fastest and slowest call.

    .venv/bin/python benchmarks/realtime_detr.py [--quick] [--models rtdetr_r18vd dfine_n] [--threads 1 2] [--repeats 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import format_table, row  # noqa: E402
from visiontf.inference.export import export_onnx  # noqa: E402
from visiontf.models import create_model  # noqa: E402
from visiontf.models.rtdetr.deploy import fuse_for_inference  # noqa: E402

MODELS = ("rtdetr_r18vd", "rtdetrv2_r18vd", "dfine_n", "dfine_s")
NUM_CLASSES = 80
SIZES = {"full": 640, "quick": 320, "tiny": 96}
#: transformers' per-layer tables that are fixed, not weights: randomising them would change the model
FIXED = ("num_points_scale", "n_points_scale")
#: the fraction of queries that must equal transformers' (see :func:`agreement`)
AGREE = 0.9


def hf_config(model: torch.nn.Module, name: str):
    """transformers' config of visiontf's ``model`` (built as ``name``): the same widths, levels and points."""
    enc, dec = model.encoder.options, model.decoder.options
    points = list(dec.num_points) if isinstance(dec.num_points, (tuple, list)) else dec.num_points
    in_channels = list(model.backbone.channels)
    common = dict(encoder_hidden_dim=enc.hidden_dim, encoder_in_channels=in_channels, encoder_ffn_dim=enc.dim_feedforward,
                  encoder_attention_heads=enc.nhead, encode_proj_layers=list(enc.aifi_levels), hidden_expansion=enc.expansion,
                  d_model=dec.hidden_dim, decoder_in_channels=[enc.hidden_dim] * dec.num_levels, decoder_ffn_dim=dec.dim_feedforward,
                  decoder_attention_heads=dec.nhead, decoder_layers=dec.num_layers, num_queries=dec.num_queries,
                  num_feature_levels=dec.num_levels, feat_strides=list(model.backbone.strides), num_labels=NUM_CLASSES,
                  eval_idx=dec.eval_idx)
    if name.startswith("rtdetr"):
        from transformers import RTDetrConfig, RTDetrResNetConfig, RTDetrV2Config

        bb = model.backbone
        depths = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3]}[bb.depth]
        widths = [64, 128, 256, 512] if bb.depth < 50 else [256, 512, 1024, 2048]
        backbone = RTDetrResNetConfig(embedding_size=64, hidden_sizes=widths, depths=depths,
                                      layer_type="basic" if bb.depth < 50 else "bottleneck", out_indices=[2, 3, 4])
        if name.startswith("rtdetrv2"):
            return RTDetrV2Config(backbone_config=backbone, decoder_n_points=points if isinstance(points, int) else points[0],
                                  decoder_method="discrete" if dec.sampling == "discrete" else "default",
                                  decoder_offset_scale=dec.offset_scale, depth_mult=enc.depth_mult, **common)
        return RTDetrConfig(backbone_config=backbone, decoder_n_points=points, depth_mult=enc.depth_mult, **common)
    from transformers import DFineConfig, HGNetV2Config

    from visiontf.models.backbones.hgnetv2 import hgnetv2_arch

    stem, stages = hgnetv2_arch(model.backbone.arch)
    use_lab = any(key.endswith("lab.scale") for key in model.backbone.state_dict())  # the learnable affine blocks, as built
    levels = {3: [2, 3, 4], 2: [3, 4]}[dec.num_levels]
    backbone = HGNetV2Config(stem_channels=[3, *stem], stage_in_channels=[r[0] for r in stages], stage_mid_channels=[r[1] for r in stages],
                             stage_out_channels=[r[2] for r in stages], stage_num_blocks=[r[3] for r in stages],
                             stage_downsample=[r[4] for r in stages], stage_light_block=[r[5] for r in stages],
                             stage_kernel_size=[r[6] for r in stages], stage_numb_of_layers=[r[7] for r in stages],
                             use_learnable_affine_block=use_lab, out_indices=levels, embedding_size=stem[1],
                             hidden_sizes=[r[2] for r in stages], depths=[r[3] for r in stages])
    return DFineConfig(backbone_config=backbone, decoder_n_points=points, depth_mult=enc.depth_mult, max_num_bins=dec.reg_max,
                       lqe_hidden_dim=dec.lqe_hidden, lqe_layers=dec.lqe_layers, top_prob_values=dec.lqe_topk, reg_scale=dec.reg_scale,
                       **common)


def _randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights of realistic scale (matrices N(0, 1/fan_in), biases N(0, 0.1), running variances in [0.5, 1.5])."""
    g = torch.Generator().manual_seed(seed)
    done: set[int] = set()
    with torch.no_grad():
        for key, t in model.state_dict(keep_vars=True).items():
            if not t.is_floating_point() or id(t) in done or key.endswith(FIXED):
                continue
            done.add(id(t))
            if key.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif t.dim() >= 2:
                t.copy_(torch.randn(t.shape, generator=g) / t[0].numel() ** 0.5)
            elif "norm" in key and key.endswith("weight"):
                t.copy_(1 + 0.2 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(0.1 * torch.randn(t.shape, generator=g))


def build_pair(name: str, workdir: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(transformers' model, visiontf's loading its weights), both eval, images in [0, 1] (no normalisation)."""
    import transformers
    from safetensors.torch import save_file

    shape = create_model(name, num_classes=NUM_CLASSES, input_norm="none")
    config = hf_config(shape, name)
    cls = {"RTDetrConfig": transformers.RTDetrForObjectDetection, "RTDetrV2Config": transformers.RTDetrV2ForObjectDetection,
           "DFineConfig": transformers.DFineForObjectDetection}[type(config).__name__]
    torch.manual_seed(0)
    hf = cls(config).eval()
    _randomize(hf)
    path = workdir / f"{name}_hf.safetensors"
    save_file({k: v.contiguous().clone() for k, v in hf.state_dict().items()}, str(path))
    ours = create_model(name, pretrained=str(path), num_classes=NUM_CLASSES, input_norm="none").eval()
    return hf, ours


def agreement(ref: tuple, got: tuple, atol: float = 1e-3) -> float:
    """The fraction of ``got``'s queries whose logits and box equal (within ``atol``) those of some query of ``ref``.

    On random weights the query selection's top-k ranks near-equal encoder scores, which float32 reordering
    (another convolution algorithm, another attention core) may swap; a swapped query also moves the others a little
    through self-attention. The parity tests compare exactly (tests/models/rtdetr, tests/models/dfine); here a path
    agrees when most queries do."""
    r = torch.cat([t.float().flatten(2) for t in ref], -1)[0]  # (Q, K + 4)
    g = torch.cat([t.float().flatten(2) for t in got], -1)[0]
    nearest = torch.cdist(g, r, p=float("inf")).min(1).values
    return float((nearest <= atol).float().mean())


def time_both(fns: dict, warmup: int = 2, repeats: int = 5) -> dict[str, dict[str, float]]:
    """Per function: the median, min and max wall seconds and calling-thread CPU seconds per call, the functions
    alternating at every repeat after ``warmup`` untimed rounds."""
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            t1, c1 = time.perf_counter(), time.thread_time()
            if r >= warmup:
                wall[name].append(t1 - t0)
                cpu[name].append(c1 - c0)
    return {k: {"wall": statistics.median(wall[k]), "wall_min": min(wall[k]), "wall_max": max(wall[k]),
                "cpu": statistics.median(cpu[k]), "cpu_min": min(cpu[k]), "cpu_max": max(cpu[k])} for k in fns}


def run(quick: bool = False, models: tuple[str, ...] = MODELS, threads: tuple[int, ...] = (1, 2), repeats: int = 7,
        size: int | None = None) -> list[dict]:
    import onnxruntime as ort
    import transformers

    side = size or SIZES["quick" if quick else "full"]
    x = torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(1, side, side, dtype=torch.bool)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            hf, ours = build_pair(name, Path(tmp))
            with torch.inference_mode():
                ref = hf(pixel_values=x)
                ref = (ref.logits, ref.pred_boxes)
                got = ours(x)
                got = (got["pred_logits"], got["pred_boxes"])
            eager_same = agreement(ref, got)
            fused = create_model(name, num_classes=NUM_CLASSES, input_norm="none").eval()
            fused.load_state_dict(ours.state_dict())
            fuse_for_inference(fused)
            with torch.inference_mode():
                out = fused(x)
            fused_same = agreement(ref, (out["pred_logits"], out["pred_boxes"]))
            onnx_path = export_onnx(fused, Path(tmp) / f"{name}.onnx", image_size=(side, side))
            for n in threads:
                torch.set_num_threads(n)
                opts = ort.SessionOptions()
                opts.intra_op_num_threads, opts.inter_op_num_threads = n, 1
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
                feeds = {"images": x.numpy(), "mask": mask.numpy()}
                ort_out = tuple(torch.from_numpy(np.asarray(o)) for o in sess.run(None, feeds))
                ort_same = agreement(ref, ort_out)

                def hf_call(hf=hf):
                    with torch.inference_mode():
                        hf(pixel_values=x)

                def ours_call(m=ours):
                    with torch.inference_mode():
                        m(x)

                load = os.getloadavg()[0]
                times = time_both({"hf": hf_call, "eager": ours_call, "fused": lambda m=fused: ours_call(m),
                                   "onnxruntime": lambda s=sess, f=feeds: s.run(None, f)}, warmup=2, repeats=repeats)
                extra = dict(threads=n, size=side, hf_version=transformers.__version__, ort_version=ort.__version__,
                             load_before=load, load_after=os.getloadavg()[0])
                hf_times = times["hf"]
                for path, same in (("eager", eager_same), ("fused", fused_same), ("onnxruntime", ort_same)):
                    t = times[path]
                    rows.append(row(f"{name} {path} {n}t", t["wall"], hf_times["wall"], same >= AGREE, f"transformers {type(hf).__name__}",
                                    queries_agreeing=same, cpu_s=t["cpu"], ref_cpu_s=hf_times["cpu"], cpu_ratio=hf_times["cpu"] / t["cpu"],
                                    spread={"ours_wall": (t["wall_min"], t["wall_max"]), "ref_wall": (hf_times["wall_min"], hf_times["wall_max"]),
                                            "ours_cpu": (t["cpu_min"], t["cpu_max"]), "ref_cpu": (hf_times["cpu_min"], hf_times["cpu_max"])}, **extra))
                print(format_table(rows[-3:]), flush=True)
                print(cpu_table(rows[-3:]), flush=True)
    return rows


def cpu_table(rows: list[dict]) -> str:
    """The rows' CPU-time medians and ratios, each path's spread (min-max over the repeats) and the load average."""
    lines = ["benchmark | ours cpu (s) [min-max] | ref cpu (s) [min-max] | cpu ratio | wall [min-max] ours / ref | load"]
    for r in rows:
        sp = r["spread"]
        lines.append(f"{r['benchmark']} | {r['cpu_s']:.4f} [{sp['ours_cpu'][0]:.3f}-{sp['ours_cpu'][1]:.3f}] | "
                     f"{r['ref_cpu_s']:.4f} [{sp['ref_cpu'][0]:.3f}-{sp['ref_cpu'][1]:.3f}] | {r['cpu_ratio']:.2f}x | "
                     f"[{sp['ours_wall'][0]:.3f}-{sp['ours_wall'][1]:.3f}] / [{sp['ref_wall'][0]:.3f}-{sp['ref_wall'][1]:.3f}] | "
                     f"{r['load_before']:.1f}-{r['load_after']:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="320 x 320 instead of 640 x 640")
    p.add_argument("--models", nargs="+", default=list(MODELS),
                   help=f"registered RT-DETR, RT-DETRv2 and D-FINE names transformers can build (default: {' '.join(MODELS)})")
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    from visiontf.models import ModelNameError
    from visiontf.models._registry import check_model_arguments

    for name in args.models:  # before any timing (on the meta device: nothing allocated), in one line: a name or a layout
        try:                  # transformers cannot take
            hf_config(check_model_arguments(name, num_classes=NUM_CLASSES, input_norm="none"), name)
        except ModelNameError as e:
            p.error(f"--models {name}: {e}")
        except Exception as e:  # noqa: BLE001 - transformers' config validation, in its own classes
            p.error(f"--models {name}: transformers cannot build this model's settings ({type(e).__name__}: "
                    f"{' '.join(str(e).split())[:200]})")
    rows = run(args.quick, tuple(args.models), tuple(args.threads), args.repeats)
    print(format_table(rows))
    print(cpu_table(rows))
    return 0 if all(r["same_result"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
