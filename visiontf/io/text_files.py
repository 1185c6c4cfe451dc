"""Text files users write by hand (label files, class lists, dataset YAML): read as UTF-8, one message for others."""
from __future__ import annotations

from pathlib import Path

__all__ = ["read_utf8_text"]


def read_utf8_text(path: str | Path, error: type[Exception]) -> str:
    """The file's text as UTF-8, a byte-order mark (which Windows tools write) left out; text of another encoding
    raises ``error`` naming the file, the byte and the fix."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
