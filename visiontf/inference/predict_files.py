"""``tools/predict.py``'s work as a library function: images in, pictures and ``predictions.json`` out,
streamed so that memory does not grow with the number of files.

Inputs are listed first (nothing decoded), the task's writer checks them (detection: the image ids
of ``--annotations``, ambiguity is an error before any inference), then the Predictor streams
batches (files decoded in DataLoader workers) and each result is written as it comes. Inputs that
cannot be predicted are listed in ``failed.json`` with the reason, and counted in one warning.

Each batch allocates and frees large buffers (full-size float images, pictures). glibc's malloc
raises its mmap threshold after such frees and then serves them from the heap, which fragments and
grows with the number of images although nothing is kept. :func:`return_large_buffers_to_the_os`
fixes the threshold at 1 MiB, so those buffers are mapped and unmapped each time and the peak stays
flat (``benchmarks/predict_memory.py`` measures it; docs/record/speed.md#measurements-behind-comments-in-the-code).
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from visiontf.core.progress import progress
from visiontf.data.inputs import InputError, InputFailure, expand_inputs

log = logging.getLogger(__name__)


def return_large_buffers_to_the_os(threshold: int = 1 << 20) -> bool:
    """glibc only (a no-op elsewhere): allocations above ``threshold`` bytes always use ``mmap``, so
    freeing them returns the memory at once (``mallopt(M_MMAP_THRESHOLD)``, which also stops glibc
    from raising the threshold by itself). Process-wide; returns whether it was set."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_mmap_threshold = -3
    return bool(libc.mallopt(m_mmap_threshold, int(threshold)))


def unique_stems(sources: Sequence[str | None]) -> list[str]:
    """Output names, one per input and never two alike: each file's path relative to the inputs' common
    folder without its suffix (``camA/0001``: pictures mirror the input folders), the suffix kept where two
    files differ only by it (``a.jpg``, ``a.png``), ``image_<i>`` for an input without a path; a name
    still taken is numbered ``~1``, ``~2``... (a tensor input named like a file)."""
    files = [Path(s) for s in sources if s]
    # absolute, not resolved: a link is named as given, and a loop of links (which resolve() raises on) is an input
    # that fails later, not a crash here
    root = Path(os.path.commonpath([os.path.abspath(f.parent) for f in files])) if files else None

    def relative(source: str) -> Path:
        path = Path(os.path.abspath(source))
        return path.relative_to(root) if root is not None and path.is_relative_to(root) else Path(path.name)

    preferred = [relative(s).with_suffix("").as_posix() if s else f"image_{i:05d}" for i, s in enumerate(sources)]
    repeats = Counter(preferred)
    names = [relative(s).as_posix() if s and repeats[p] > 1 else p for s, p in zip(sources, preferred)]
    wanted, used, stems = set(names), set(), []
    for name in names:
        stem, k = name, 0
        while stem in used or (k and stem in wanted):
            k += 1
            stem = f"{name}~{k}"
        used.add(stem)
        stems.append(stem)
    return stems


def predict_to_folder(predictor: Any, inputs: Sequence[Any], out: str | Path, *, annotations: str | Path | None = None,
                      score_threshold: float | None = 0.5, top_k: int | None = None, attention: bool = False
                      ) -> dict[str, Any]:
    """Predict ``inputs`` (paths, folders, or any :class:`~visiontf.inference.Predictor` input) into ``out``.

    Writes one picture per image (and ``<stem>_attention.png`` / ``_rollout.png`` with ``attention``),
    ``predictions.json`` (the task's records) and, when some inputs failed, ``failed.json``. Returns
    ``{"images", "predicted", "failed", "records"}``. When no input could be predicted, the first
    error is raised.
    """
    return_large_buffers_to_the_os()
    items = expand_inputs(list(inputs))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sources = [it.source for it in items]
    stems = unique_stems(sources)
    for stem in {str(Path(s).parent) for s in stems} - {"."}:
        (out / stem).mkdir(parents=True, exist_ok=True)
    adapter = predictor.adapter
    writer = adapter.prediction_writer(out, predictor, sources, annotations)
    failed: list[dict[str, Any]] = []
    first_failure: InputFailure | None = None
    stream = predictor.stream(items, score_threshold=score_threshold, top_k=top_k)
    for (image, result), stem in zip(progress(stream, total=len(items), desc="predict", unit="image"), stems):
        if "error" in result:
            failed.append({"input": result.get("source") or stem, "error": result["error"]})
            if first_failure is None and isinstance(image, InputFailure):
                first_failure = image
            writer.skip()
            continue
        writer.add([image], [result], [stem])
        if attention:
            adapter.save_attention(predictor, image, out, stem, score_threshold=score_threshold)
    if items and len(failed) == len(items):
        if first_failure is not None and first_failure.exception is not None:
            raise first_failure.exception
        raise InputError(f"no input could be predicted: {failed[0]['error']}")
    records = writer.finish()
    try:  # JSON has no NaN: a non-finite value must never reach the file as the invalid token NaN
        text = json.dumps(records, allow_nan=False)
    except ValueError as e:
        raise InputError(f"{out / 'predictions.json'}: the model's outputs hold NaN or infinite values ({e}); "
                         "nothing was written. The checkpoint comes from a diverged run?") from e
    (out / "predictions.json").write_text(text + "\n")
    if failed:
        (out / "failed.json").write_text(json.dumps(failed, indent=1) + "\n")
        log.warning("%d of %d inputs were not predicted (each with its reason in %s), e.g. %s", len(failed), len(items),
                    out / "failed.json", failed[0]["error"])
    log.info("%d images -> %s (%s)", len(items) - len(failed), out, predictor.task)
    return {"images": len(items), "predicted": len(items) - len(failed), "failed": failed, "records": len(records)}


__all__ = ["predict_to_folder", "unique_stems"]
