"""Reading an offline W&B run's transaction log (``run-<id>.wandb``) without the W&B service, for the tests.

wandb >= 0.18 writes the log from its Go core and ships no Python reader. The format is LevelDB's log:
a 7-byte header (``:W&B``, magic 0xBEE1, version), then 32 KiB blocks of chunks, each with a 7-byte
header (CRC32, length, type: 1 full, 2 first, 3 middle, 4 last; a block's tail shorter than a header is
padding); each whole record is a ``wandb.proto.wandb_internal_pb2.Record``.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = struct.Struct("<IHB")


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path}: not a W&B transaction log (header {ident!r} {magic:#x})")
    pos, pending = 7, b""
    while pos + HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER.size:
            pos += left
            continue
        _, length, kind = HEADER.unpack_from(data, pos)
        chunk = data[pos + HEADER.size:pos + HEADER.size + length]
        pos += HEADER.size + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def summarize(run_dir: Path) -> dict[str, Any]:
    """An offline run folder's logged metrics (key -> list of values), config, artifacts and files."""
    (log_file,) = Path(run_dir).glob("run-*.wandb")
    history: dict[str, list[Any]] = {}
    config: dict[str, Any] = {}
    artifacts, files, kinds = [], [], set()
    for r in records(log_file):
        kind = r.WhichOneof("record_type")
        kinds.add(kind)
        if kind == "history":
            for item in r.history.item:
                history.setdefault(item.key or "/".join(item.nested_key), []).append(json.loads(item.value_json))
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in r.config.update})
        elif kind == "artifact":
            artifacts.append({"name": r.artifact.name, "type": r.artifact.type,
                              "files": [m.path for m in r.artifact.manifest.contents]})
        elif kind == "files":
            files += [f.path for f in r.files.files]
    return {"history": history, "config": config, "artifacts": artifacts, "files": files, "kinds": kinds}
