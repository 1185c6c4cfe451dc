"""``tools/app.py --ckpt_path K``: a local web app to try a model by dropping images on it (Gradio).

One page for every task: an image (or a batch of files) in; the task adapter's picture of the result
(:meth:`~visiontf.adapters.base.TaskAdapter.view`: boxes and labels, segmentation overlays, a restored
image beside its input, a VQGAN reconstruction beside the original), a one-line summary, the top
classes of a classifier, the predictions as JSON and as a download. For detectors a score slider
redraws the boxes without running the model again (the model keeps every detection; the slider filters).
The work is the :class:`~visiontf.inference.Predictor`'s and the adapters'; this module only lays it out.

It runs on the CPU (``--device``) and serves on 127.0.0.1 only unless ``--host`` says otherwise. It sends
nothing anywhere: Gradio's analytics are off (``GRADIO_ANALYTICS_ENABLED=False``, set before Gradio is
imported), the page's fonts are the system's (the default theme would load Google Fonts), and no share
link is made. Gradio is an optional extra: ``pip install visiontf[app]``.
"""
from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from visiontf.cli.checks import checkpoint_file, weights_file
from visiontf.cli.errors import run_tool
from visiontf.core.arguments import ToolParser
from visiontf.core.errors import UsageError

log = logging.getLogger(__name__)

__all__ = ["AppModel", "app_main", "build_app"]

#: set (unless the user set them) before Gradio and huggingface_hub are imported: they read them at import
QUIET_ENV = {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_DISABLE_TELEMETRY": "1"}
#: system fonts only: Gradio's default theme loads its fonts from fonts.googleapis.com
SYSTEM_FONTS = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif")
MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


@dataclass
class Shown:
    """One predicted image: its source, the image (uint8 (3, H, W)) and the Predictor's result."""

    source: str
    image: Any
    result: dict[str, Any]


class AppModel:
    """What the page does, without the page: run the Predictor, picture and describe its results through
    the task's adapter (testable without a browser)."""

    def __init__(self, predictor: Any, top_k: int = 5) -> None:
        self.predictor = predictor
        self.adapter = predictor.adapter
        self.top_k = top_k

    @property
    def filters_by_score(self) -> bool:
        return self.adapter.filters_by_score

    def predict(self, paths: Sequence[str]) -> list[Shown]:
        """Every image of ``paths``; a detector keeps all its detections (the slider filters them later)."""
        shown = []
        for image, result in self.predictor.stream(list(paths), score_threshold=None, top_k=self.top_k
                                                    if not self.filters_by_score else None):
            if "error" in result:
                raise UsageError(result["error"])
            shown.append(Shown(str(result.get("source") or "image"), image.uint8(), result))
        return shown

    def picture(self, item: Shown, score_threshold: float) -> Any:
        """The adapter's picture as an (H, W, 3) uint8 array."""
        view = self.adapter.view(item.image, item.result, score_threshold, self.predictor.num_classes)
        return view.permute(1, 2, 0).contiguous().numpy()

    def record(self, item: Shown, score_threshold: float) -> dict[str, Any]:
        return {"file": Path(item.source).name, **self.adapter.record(item.result, score_threshold, self.predictor.class_name)}

    def describe(self, items: Sequence[Shown], score_threshold: float) -> str:
        return "\n".join(f"{Path(i.source).name}: {self.adapter.describe(i.result, score_threshold, self.predictor.class_name)}"
                         for i in items)

    def top_classes(self, item: Shown) -> dict[str, float] | None:
        return self.adapter.top_classes(item.result)


def _write_json(folder: Path, name: str, payload: Any) -> str:
    path = Path(tempfile.mkdtemp(dir=folder)) / name
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return str(path)


def build_app(app: AppModel, score_threshold: float = 0.5, title: str = "visiontf"):
    """The Gradio ``Blocks`` of the page (not launched)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import gradio as gr

    folder = Path(tempfile.mkdtemp(prefix="visiontf_app_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    model = type(app.predictor.model).__name__
    names = app.predictor.class_names

    def show(items: list[Shown] | None, threshold: float):
        if not items:
            return None, "", gr.Label(visible=False), None, None
        records = [app.record(i, threshold) for i in items]
        top = app.top_classes(items[0])
        return (app.picture(items[0], threshold), app.describe(items, threshold), gr.Label(value=top, visible=top is not None),
                records[0], _write_json(folder, "predictions.json", records[0]))

    def run_one(path: str | None, threshold: float):
        items = app.predict([path]) if path else None
        return (items, *show(items, threshold))

    def show_batch(items: list[Shown] | None, threshold: float):
        if not items:
            return [], "", None, None
        records = [app.record(i, threshold) for i in items]
        gallery = [(app.picture(i, threshold), Path(i.source).name) for i in items]
        return gallery, app.describe(items, threshold), records, _write_json(folder, "predictions.json", records)

    def run_batch(files: list[str] | None, threshold: float):
        items = app.predict([str(f) for f in files]) if files else None
        return (items, *show_batch(items, threshold))

    with gr.Blocks(title=title, analytics_enabled=False) as page:
        gr.Markdown(f"## {title}\n{model} ({app.adapter.task})" + (f", {len(names)} classes" if names else ""))
        single, batch = gr.State(), gr.State()
        threshold = gr.Slider(0.0, 1.0, value=score_threshold, step=0.01, label="score threshold",
                              visible=app.filters_by_score, elem_id="score_threshold")
        with gr.Tab("One image"):
            with gr.Row():
                with gr.Column():
                    image = gr.Image(type="filepath", format="png", label="image", height=360, elem_id="input_image")
                    run = gr.Button("Run", variant="primary", elem_id="run")
                with gr.Column():
                    picture = gr.Image(type="numpy", format="png", label="result", interactive=False, height=360,
                                       elem_id="result_image")
                    summary = gr.Textbox(label="summary", interactive=False, elem_id="summary")
                    top = gr.Label(num_top_classes=app.top_k, label="top classes", visible=False, elem_id="top_classes")
            record = gr.JSON(label="predictions", elem_id="predictions")
            download = gr.File(label="predictions.json", elem_id="download")
        with gr.Tab("Batch"):
            files = gr.File(file_count="multiple", file_types=["image"], label="images", elem_id="batch_files")
            run_many = gr.Button("Run on all", variant="primary", elem_id="run_batch")
            gallery = gr.Gallery(label="results", columns=4, elem_id="gallery")
            batch_summary = gr.Textbox(label="summary", interactive=False, elem_id="batch_summary")
            batch_record = gr.JSON(label="predictions", elem_id="batch_predictions")
            batch_download = gr.File(label="predictions.json", elem_id="batch_download")
        outputs = [picture, summary, top, record, download]
        batch_outputs = [gallery, batch_summary, batch_record, batch_download]
        run.click(run_one, [image, threshold], [single, *outputs])
        image.upload(run_one, [image, threshold], [single, *outputs])
        run_many.click(run_batch, [files, threshold], [batch, *batch_outputs])
        # the slider redraws from the kept results: no model run
        threshold.change(show, [single, threshold], outputs)
        threshold.change(show_batch, [batch, threshold], batch_outputs)
    return page


def theme():
    """Gradio's default look with the system's fonts (no font files from the network)."""
    import gradio as gr

    return gr.themes.Default(font=list(SYSTEM_FONTS), font_mono=list(MONO_FONTS))


def app_parser() -> ToolParser:
    p = ToolParser(prog="app.py", description="A local web app: drop an image, see what the model makes of it.")
    p.add_argument("--ckpt_path", help="Lightning checkpoint (.ckpt)")
    p.add_argument("--weights", help="exported model (.safetensors from tools/export.py) instead of a checkpoint")
    p.add_argument("--config", help="training YAML: class names of checkpoints that lack them")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--score_threshold", type=float, default=0.5, help="detection: the slider's starting value")
    p.add_argument("--top_k", type=int, default=5, help="classification: classes shown")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default: this machine only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--min_size", type=int, help="detection: shorter side (default: the checkpoint's)")
    p.add_argument("--max_size", type=int, help="detection: longer side cap")
    return p


def _app(argv: Sequence[str]) -> int:
    args = app_parser().parse_args(argv)
    if bool(args.ckpt_path) == bool(args.weights):
        raise UsageError("give --ckpt_path K.ckpt or --weights W.safetensors (one of them)")
    if not 0.0 <= args.score_threshold < 1.0:
        raise UsageError(f"--score_threshold {args.score_threshold}: give a value in [0, 1)")
    if args.top_k < 1:
        raise UsageError(f"--top_k {args.top_k}: must be >= 1")
    if args.ckpt_path:
        args.ckpt_path = str(checkpoint_file(args.ckpt_path))
    else:
        args.weights = str(weights_file(args.weights))
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import gradio  # noqa: F401
    except ImportError as e:
        raise UsageError("tools/app.py needs Gradio: pip install 'visiontf[app]'") from e
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from visiontf.cli.predict import build_predictor

    predictor = build_predictor(argparse.Namespace(weights=args.weights, ckpt_path=args.ckpt_path, config=args.config,
                                                   device=args.device, min_size=args.min_size, max_size=args.max_size,
                                                   batch_size=4, num_workers=0, precision=None))
    source = Path(args.ckpt_path or args.weights).name
    page = build_app(AppModel(predictor, args.top_k), args.score_threshold, title=f"visiontf: {source}")
    log.info("serving on http://%s:%d (Ctrl+C stops)", args.host, args.port)
    page.launch(server_name=args.host, server_port=args.port, share=False, ssr_mode=False, theme=theme(),
                show_error=True, quiet=False)
    return 0


def app_main(argv: list[str] | None = None) -> int:
    """``tools/app.py --ckpt_path K [--device cpu] [--port 7860]``; a user mistake exits with code 2."""
    return run_tool(_app, argv, prog="app.py")
