"""``tools/app.py --ckpt_path K``: a local web app to try a model by dropping images on it (Gradio).

One page for every task: an image (or a batch of files) in; the task adapter's picture of the result
(:meth:`~visiontf.tasks.task_inference.TaskAdapter.view`: boxes and labels, segmentation overlays, a restored
image beside its input, a VQGAN reconstruction beside the original), a one-line summary, the top
classes of a classifier, the predictions as JSON and as a download. For detectors a score slider
redraws the boxes without running the model again (the model keeps every detection; the slider filters).
The work is the :class:`~visiontf.inference.Predictor`'s and the adapters'; this module only lays it out.
A mask model's results also go through ``tools/predict.py``'s writer (the adapter's
``prediction_writer``): each detection of the JSON carries predict.py's ``segmentation`` (COCO RLE), and a
panoptic model's ``panoptic.json`` and ``<name>_panoptic.png`` are offered for download.

Uploads are hostile until shown otherwise. The app takes Gradio's uploads as they arrive (``preprocess=False``:
Gradio neither decodes nor converts them) and reads each file's size from its header first
(:func:`check_image_header`, Pillow's lazy open): a file larger than visiontf's decompression-bomb limit
(:data:`visiontf.data.io.MAX_IMAGE_PIXELS`) or that is not an image is refused before a pixel is decoded.
A file that fails fails alone: a batch shows the others' results and names each failed file. Every error on
the page is one visiontf line naming the upload by its own file name, never a server path
(:func:`public_line`).

It runs on the CPU (``--device``) and serves on 127.0.0.1 only unless ``--host`` says otherwise; ``--host``
and ``--port`` are checked (a test bind) before the model is loaded. It sends nothing anywhere: Gradio's
analytics are off (``GRADIO_ANALYTICS_ENABLED=False``, set before Gradio is imported), the page's fonts are the
system's (the default theme would load Google Fonts), and no share link is made. Everything it writes (Gradio's
copies of the uploads, its outputs, the app's results) lives in one ``visiontf_app_*`` folder
(``GRADIO_TEMP_DIR`` points into it), removed when the app stops by Ctrl+C, SIGTERM or SIGHUP. Gradio is
an optional extra: ``pip install visiontf[app]``.
"""
from __future__ import annotations

import argparse
import atexit
import errno
import functools
import html
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from visiontf.cli.checks import checkpoint_file, weights_file
from visiontf.cli.tool_errors import debug_enabled, run_tool, user_message
from visiontf.core.arguments import ToolParser
from visiontf.core.errors import UsageError

log = logging.getLogger(__name__)

__all__ = ["AppModel", "app_main", "build_app", "check_address", "check_image_header", "public_line"]

#: set (unless the user set them) before Gradio and huggingface_hub are imported: they read them at import
QUIET_ENV = {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_DISABLE_TELEMETRY": "1"}
#: system fonts only: Gradio's default theme loads its fonts from fonts.googleapis.com
SYSTEM_FONTS = ("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif")
MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")
#: the signals that stop the app: it removes its folder and exits 0
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")

# an absolute path inside a message (not a URL's nor a relative path's slashes): shown as its last part
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])/(?:[^\s/'\"(),;:<>\[\]]+/)*[^\s/'\"(),;:<>\[\]]*")


@dataclass
class Shown:
    """One upload: its own file name, the image (uint8 (3, H, W)) and the Predictor's result, or only
    ``{"error": line}`` when it could not be predicted. A mask model's results also hold what predict.py's
    writer wrote: each detection's ``segmentations`` (COCO RLE, in the result's order) and the image's
    ``panoptic`` annotation with its ``files`` (panoptic.json, the PNG)."""

    source: str
    image: Any
    result: dict[str, Any]
    segmentations: list[Any] | None = None
    panoptic: dict[str, Any] | None = None
    files: tuple[str, ...] = ()

    @property
    def error(self) -> str | None:
        return self.result.get("error")


def upload_name(name: str) -> str:
    """An upload's own file name as a message shows it: the last part, on one line."""
    name = " ".join(Path(str(name).replace("\\", "/")).name.split())
    return name if name.strip(".") else "upload"


def public_line(text: Any, uploads: Sequence[tuple[str, str]] = ()) -> str:
    """``text`` as one line for the page: each upload's server path replaced by its own file name, and any
    other absolute path by its last part (the server's folders are nobody's business)."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    text = " ".join((lines[0] if lines else str(text)).split())
    for path, name in uploads:
        for p in sorted({str(path), str(Path(path).resolve())}, key=len, reverse=True):
            text = text.replace(p, name)
    return _ABSOLUTE_PATH.sub(lambda m: Path(m.group()).name or m.group(), text)


def check_image_header(path: str | Path, name: str | None = None) -> str | None:
    """Why the file cannot be predicted, read from its header only (Pillow's ``Image.open`` is lazy: no
    pixel is decoded), or None. Refuses an empty file, a file that is not an image, and one larger than
    visiontf's decompression-bomb limit (:data:`visiontf.data.io.MAX_IMAGE_PIXELS`, width x height)."""
    from PIL import Image, UnidentifiedImageError

    from visiontf.data import io  # also sets Pillow's limit to visiontf's
    from visiontf.io.image_files import open_image

    path = Path(path)
    name = name or path.name
    limit = io.MAX_IMAGE_PIXELS
    bomb = ("{name}: image larger than the decompression-bomb limit of {limit:,} pixels ({shape}) "
            "(visiontf.data.io.MAX_IMAGE_PIXELS); refused from its header, nothing was decoded: downscale it")
    if not path.is_file():
        return f"{name}: the upload did not arrive (no file); upload it again"
    if path.stat().st_size == 0:
        return f"{name}: file is empty (0 bytes)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with open_image(path) as img:
                w, h = img.size
    except Image.DecompressionBombError as e:  # above twice Pillow's limit: refused before the size is given
        found = re.search(r"\((\d+) pixels\)", str(e))
        return bomb.format(name=name, limit=limit or 0, shape=f"{int(found.group(1)):,} pixels" if found else "more")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        return f"{name}: not a readable image (wrong extension or corrupt header); upload a PNG, JPEG, BMP, TIFF or WebP file"
    if limit is not None and w * h > limit:
        return bomb.format(name=name, limit=limit, shape=f"{w}x{h} = {w * h:,} pixels")
    if w == 0 or h == 0:
        return f"{name}: image of {w}x{h} pixels has no pixels"
    return None


class AppModel:
    """What the page does, without the page: run the Predictor, picture and describe its results through
    the task's adapter (testable without a browser)."""

    def __init__(self, predictor: Any, top_k: int = 5, folder: str | Path | None = None) -> None:
        self.predictor = predictor
        self.adapter = predictor.adapter
        self.top_k = top_k
        self.folder = Path(folder) if folder is not None else None
        # here, not at the top: importing visiontf.models loads every model (torch, timm), which a mistake on the
        # command line must not wait for
        from visiontf.models.contract import Detector

        # a detector declares its mask options (visiontf.models.contract.Detector); other kinds have none
        options = predictor.model.mask_options if isinstance(predictor.model, Detector) else None
        #: a mask model's results go through predict.py's writer (segmentations, panoptic files)
        self.writes_files = options is not None
        self.panoptic = options is not None and bool(options.panoptic)

    @property
    def filters_by_score(self) -> bool:
        return self.adapter.filters_by_score

    def workdir(self) -> Path:
        """The app's folder for its results (made on first use; removed at exit when the app made it)."""
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="visiontf_app_"))
            atexit.register(shutil.rmtree, self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder

    def predict(self, paths: Sequence[str], names: Sequence[str] | None = None) -> list[Shown]:
        """One :class:`Shown` per file of ``paths``, in order (``names``: the uploads' own file names). Each file's
        header is checked first; a file that cannot be predicted gets ``{"error": line}`` and the others still
        run. A detector keeps all its detections (the slider filters them later)."""
        paths = [str(p) for p in paths]
        names = [upload_name(n) for n in names] if names is not None else [upload_name(p) for p in paths]
        uploads = list(zip(paths, names))
        shown: list[Shown | None] = [None] * len(paths)
        todo = []
        for i, (path, name) in enumerate(uploads):
            problem = check_image_header(path, name)
            if problem is None:
                todo.append(i)
            else:
                log.warning("not predicted: %s", problem)
                shown[i] = Shown(name, None, {"error": problem})
        if todo:
            try:
                self._run(todo, uploads, shown)
            except Exception as e:  # the Predictor raises when every image of its first batch fails: each file alone
                log.warning("%s; predicting the %d file(s) one by one", public_line(user_message(e) or e, uploads), len(todo))
                for i in todo:
                    try:
                        self._run([i], uploads, shown)
                    except Exception as alone:
                        line = _failure_line(alone, uploads[i], uploads)
                        log.warning("not predicted: %s", line, exc_info=debug_enabled())
                        shown[i] = Shown(uploads[i][1], None, {"error": line})
        return shown  # type: ignore[return-value]

    def _run(self, todo: list[int], uploads: list[tuple[str, str]], shown: list[Shown | None]) -> None:
        from visiontf.inference.predict_files import unique_stems

        paths = [uploads[i][0] for i in todo]
        stems = unique_stems([uploads[i][1] for i in todo])
        writer = out = None
        if self.writes_files:  # tools/predict.py's writer, as predict_to_folder drives it
            out = Path(tempfile.mkdtemp(prefix="run_", dir=self.workdir()))
            writer = self.adapter.prediction_writer(out, self.predictor, paths)
        top_k = None if self.filters_by_score else self.top_k
        stream = self.predictor.stream(paths, score_threshold=None, top_k=top_k)
        for i, stem, (image, result) in zip(todo, stems, stream):
            name = uploads[i][1]
            if "error" in result:
                shown[i] = Shown(name, None, {"error": public_line(result["error"], uploads)})
                if writer is not None:
                    writer.skip()
                continue
            item = Shown(name, image.uint8(), result)
            if writer is not None:
                before = len(writer.records)
                writer.add([image], [result], [stem])
                # predict.py's records of this image, one per detection in the result's order
                item.segmentations = [r.get("segmentation") for r in writer.records[before:]]
            shown[i] = item
        if writer is not None:
            writer.finish()
            self._attach_panoptic(out, [(shown[i], stem) for i, stem in zip(todo, stems)])

    def _attach_panoptic(self, out: Path, items: list[tuple[Shown | None, str]]) -> None:
        path = out / "panoptic.json"
        if not path.is_file():
            return
        by_file = {a["file_name"]: a for a in json.loads(path.read_text())["annotations"]}
        for item, stem in items:
            found = by_file.get(f"{stem}_panoptic.png")
            if item is not None and item.error is None and found is not None:
                item.panoptic = {"file_name": found["file_name"], "segments_info": found["segments_info"]}
                item.files = (str(path), str(out / found["file_name"]))

    def picture(self, item: Shown, score_threshold: float) -> Any:
        """The adapter's picture as an (H, W, 3) uint8 array."""
        view = self.adapter.view(item.image, item.result, score_threshold, self.predictor.num_classes)
        return view.permute(1, 2, 0).contiguous().numpy()

    def record(self, item: Shown, score_threshold: float) -> dict[str, Any]:
        """The adapter's record of the item; a mask model's detections each with predict.py's
        ``segmentation``, a panoptic model's with its ``panoptic`` annotation; a failed file: its error."""
        if item.error is not None:
            return {"file": item.source, "error": item.error}
        record = {"file": item.source, **self.adapter.record(item.result, score_threshold, self.predictor.class_name)}
        if item.segmentations is not None and "detections" in record:
            # the adapter's record lists the detections above the threshold, best first: the same order here
            scores = item.result["scores"].float()
            kept = [i for i in scores.argsort(descending=True).tolist() if score_threshold is None or scores[i] > score_threshold]
            if len(kept) != len(record["detections"]) or len(item.segmentations) != len(scores):
                raise RuntimeError(f"{item.source}: {len(record['detections'])} detections in the record, {len(kept)} kept, "
                                   f"{len(item.segmentations)} segmentations for {len(scores)} results")
            for detection, i in zip(record["detections"], kept):
                detection["segmentation"] = item.segmentations[i]
        if item.panoptic is not None:
            record["panoptic"] = item.panoptic
        return record

    def describe(self, items: Sequence[Shown], score_threshold: float) -> str:
        """One line per item: ``<file>: <summary>``, or the failed file's error line."""
        return "\n".join(i.error if i.error is not None else
                         f"{i.source}: {self.adapter.describe(i.result, score_threshold, self.predictor.class_name)}"
                         for i in items)

    def top_classes(self, item: Shown) -> dict[str, float] | None:
        return None if item.error is not None else self.adapter.top_classes(item.result)


def _failure_line(error: BaseException, upload: tuple[str, str], uploads: Sequence[tuple[str, str]]) -> str:
    """One line for a file the model (or anything else) failed on: visiontf's message, else the exception's first line."""
    name = upload[1]
    line = public_line(user_message(error) or f"the model failed on this image: {type(error).__name__}: {error}", uploads)
    return line if line.startswith(f"{name}:") else f"{name}: {line}"


def _write_json(folder: Path, name: str, payload: Any) -> str:
    path = Path(tempfile.mkdtemp(dir=folder)) / name
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return str(path)


def uploads_of(value: Any) -> list[tuple[str, str]]:
    """``(server path, own file name)`` of each file of an Image's or a File's value as Gradio sends it
    unprocessed (``preprocess=False``: one FileData dict, a list of them, or paths)."""
    if not value:
        return []
    out = []
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, dict):
            path = v.get("path")
            if path:
                out.append((str(path), upload_name(v.get("orig_name") or path)))
        elif v:
            out.append((str(v), upload_name(v)))
    return out


def build_app(app: AppModel, score_threshold: float = 0.5, title: str = "visiontf"):
    """The Gradio ``Blocks`` of the page (not launched)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import gradio as gr

    folder = app.workdir()
    model = type(app.predictor.model).__name__
    names = app.predictor.class_names

    def one_line_errors(fn):
        """Every error on the page is one visiontf line without server paths (the traceback goes to the log)."""
        @functools.wraps(fn)
        def run(*args):
            try:
                return fn(*args)
            except gr.Error:
                raise
            except Exception as e:
                log.exception("%s failed", fn.__name__)
                raise gr.Error(html.escape(public_line(user_message(e) or f"{type(e).__name__}: {e}"), quote=False)) from None
        return run

    def warn_failed(items: list[Shown]) -> None:
        """A warning naming the files not predicted (Gradio renders it as HTML: the names are escaped)."""
        failed = [i for i in items if i.error is not None]
        if len(failed) == 1:
            gr.Warning(html.escape(failed[0].error, quote=False))
        elif failed:
            gr.Warning(html.escape(f"{len(failed)} of {len(items)} files not predicted: {', '.join(i.source for i in failed)} "
                                   "(each with its reason in the summary)", quote=False))

    def panoptic_files(items: list[Shown]) -> list[str] | None:
        files = list(dict.fromkeys(f for i in items for f in i.files))
        return files or None

    def show(items: list[Shown] | None, threshold: float):
        if not items:
            return None, "", gr.Label(visible=False), None, None, None
        item = items[0]
        record = app.record(item, threshold)
        if item.error is not None:
            return None, app.describe(items, threshold), gr.Label(visible=False), record, None, None
        top = app.top_classes(item)
        return (app.picture(item, threshold), app.describe(items, threshold), gr.Label(value=top, visible=top is not None),
                record, _write_json(folder, "predictions.json", record), panoptic_files(items))

    @one_line_errors
    def run_one(value: Any, threshold: float):
        files = uploads_of(value)
        items = app.predict([p for p, _ in files], [n for _, n in files]) if files else None
        warn_failed(items or [])
        return (items, *show(items, threshold))

    def show_batch(items: list[Shown] | None, threshold: float):
        if not items:
            return [], "", None, None, None
        records = [app.record(i, threshold) for i in items]
        gallery = [(app.picture(i, threshold), i.source) for i in items if i.error is None]
        return (gallery, app.describe(items, threshold), records, _write_json(folder, "predictions.json", records),
                panoptic_files(items))

    @one_line_errors
    def run_batch(value: Any, threshold: float):
        files = uploads_of(value)
        items = app.predict([p for p, _ in files], [n for _, n in files]) if files else None
        warn_failed(items or [])
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
            panoptic = gr.File(label="COCO panoptic: panoptic.json and the PNG", file_count="multiple",
                               visible=app.panoptic, interactive=False, elem_id="panoptic_download")
        with gr.Tab("Batch"):
            files = gr.File(file_count="multiple", label="images", elem_id="batch_files")
            run_many = gr.Button("Run on all", variant="primary", elem_id="run_batch")
            gallery = gr.Gallery(label="results", columns=4, elem_id="gallery")
            batch_summary = gr.Textbox(label="summary", interactive=False, elem_id="batch_summary")
            batch_record = gr.JSON(label="predictions", elem_id="batch_predictions")
            batch_download = gr.File(label="predictions.json", elem_id="batch_download")
            batch_panoptic = gr.File(label="COCO panoptic: panoptic.json and the PNGs", file_count="multiple",
                                     visible=app.panoptic, interactive=False, elem_id="batch_panoptic_download")
        outputs = [picture, summary, top, record, download, panoptic]
        batch_outputs = [gallery, batch_summary, batch_record, batch_download, batch_panoptic]
        # uploads reach the functions as Gradio received them (preprocess=False): Gradio would open and convert
        # each image to RGB before the app could look at its header (a decompression bomb decoded in full)
        run.click(run_one, [image, threshold], [single, *outputs], preprocess=False)
        image.upload(run_one, [image, threshold], [single, *outputs], preprocess=False)
        run_many.click(run_batch, [files, threshold], [batch, *batch_outputs], preprocess=False)
        # the slider redraws from the kept results: no model run
        threshold.change(one_line_errors(show), [single, threshold], outputs)
        threshold.change(one_line_errors(show_batch), [batch, threshold], batch_outputs)
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
    p.add_argument("--port", type=int, default=7860, help="port to serve on, 1..65535 (default 7860)")
    p.add_argument("--min_size", type=int, help="detection: shorter side (default: the checkpoint's)")
    p.add_argument("--max_size", type=int, help="detection: longer side cap")
    return p


def check_address(host: str, port: int) -> None:
    """Refuse a ``--port`` out of range, a ``--host`` that is no address of this machine and a port in use,
    naming the value and the fix (a test bind, as Gradio's server will bind)."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: a port is a number in 1..65535; give a free one, e.g. --port 7860 (the default)")
    address = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    fix = ("give an address of this machine: 127.0.0.1 (this machine only, the default), 0.0.0.0 (every network "
           "interface) or one of its own IP addresses")
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(f"--host {host}: not an IP address, nor a host name that resolves ({getattr(e, 'strerror', e)}); "
                         f"{fix}") from e
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            s.bind(where)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"--port {port}: already in use on {host} (another app, or this one still running?); "
                                 f"give a free port, e.g. --port {port + 1 if port < 65535 else 7860}") from e
            if e.errno == errno.EADDRNOTAVAIL:
                raise UsageError(f"--host {host}: not an address of this machine ({e.strerror}); {fix}") from e
            if e.errno == errno.EACCES:
                raise UsageError(f"--port {port}: this user may not serve on it ({e.strerror}; ports below 1024 need "
                                 "privileges); give a port from 1024 on, e.g. --port 7860") from e
            raise UsageError(f"--host {host} --port {port}: cannot serve there ({e.strerror})") from e


@contextmanager
def _stopped_by_signals() -> Iterator[list[str]]:
    """Ctrl+C (SIGINT), SIGTERM and SIGHUP all raise KeyboardInterrupt in the main thread (which Gradio's launch
    takes as the end of serving); yields the names of the signals received."""
    received: list[str] = []

    def stop(signum: int, frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    previous = {}
    for name in STOP_SIGNALS if threading.current_thread() is threading.main_thread() else ():
        if hasattr(signal, name):
            previous[name] = signal.signal(getattr(signal, name), stop)
    try:
        yield received
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


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
    check_address(args.host, args.port)  # before the model is loaded
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # one folder for everything the app writes, Gradio's copies of the uploads included (GRADIO_TEMP_DIR is read
    # when Gradio is imported); removed when the app stops
    folder = Path(tempfile.mkdtemp(prefix="visiontf_app_", dir=os.environ.get("GRADIO_TEMP_DIR") or None))
    os.environ["GRADIO_TEMP_DIR"] = str(folder / "gradio")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    page = None
    with _stopped_by_signals() as received:
        try:
            try:
                import gradio  # noqa: F401
            except ImportError as e:
                raise UsageError("tools/app.py needs Gradio: pip install 'visiontf[app]'") from e
            from visiontf.cli.predict import build_predictor

            predictor = build_predictor(argparse.Namespace(
                weights=args.weights, ckpt_path=args.ckpt_path, config=args.config, device=args.device,
                min_size=args.min_size, max_size=args.max_size, batch_size=4, num_workers=0, precision=None))
            source = Path(args.ckpt_path or args.weights).name
            page = build_app(AppModel(predictor, args.top_k, folder), args.score_threshold, title=f"visiontf: {source}")
            log.info("serving on http://%s:%d (Ctrl+C stops)", args.host, args.port)
            try:
                page.launch(server_name=args.host, server_port=args.port, share=False, ssr_mode=False, theme=theme(),
                            show_error=False, quiet=False)
            except OSError as e:  # taken between the check and the start
                raise UsageError(f"--host {args.host} --port {args.port}: the server could not start there "
                                 f"({public_line(e)}); give a free port (--port) on an address of this machine (--host)") from e
        except KeyboardInterrupt:
            if not received:
                raise
            # a stop signal before Gradio's loop took it (loading the model, starting the server): the same clean stop
        finally:
            if page is not None:
                page.close(verbose=False)
            shutil.rmtree(folder, ignore_errors=True)
            if page is not None or received:
                log.info("stopped%s: removed the uploads and results (%s)", f" by {received[0]}" if received else "", folder)
    return 0


def app_main(argv: list[str] | None = None) -> int:
    """``tools/app.py --ckpt_path K [--device cpu] [--port 7860]``; a user mistake exits with code 2."""
    return run_tool(_app, argv, prog="app.py")
