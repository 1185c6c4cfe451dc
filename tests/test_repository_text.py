"""Text rules of the repository: configs hold settings with a one-line why (measurements go to docs/),
and nothing cites an issue number of a tracker the repository does not have.

Cost: reads text files; well under a second.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: a measured number: a score with its metric, or a duration / ratio that a run produced
MEASUREMENT = re.compile(
    r"\d(?:\.\d+)?\s*(?:dB|%|AP\b|mAP|mIoU|PSNR|s\b|sec\b|seconds|ms\b|s/step|steps?/s)"
    r"|(?:mAP|AP|PSNR|SSIM|mIoU|accuracy)\D{0,12}\d\.\d",
)


def _comments(path: Path) -> list[tuple[int, str]]:
    return [(i, line.split("#", 1)[1]) for i, line in enumerate(path.read_text().splitlines(), 1) if "#" in line]


def test_config_comments_carry_no_measurement():
    found = [f"{p.relative_to(ROOT)}:{i}: {text.strip()}" for p in sorted((ROOT / "configs").rglob("*.yaml"))
             for i, text in _comments(p) if MEASUREMENT.search(text) and "python tools/" not in text]
    assert not found, "measurements belong in docs/, not in config comments:\n" + "\n".join(found)


def test_the_rule_catches_a_measurement():
    assert MEASUREMENT.search(" raised mAP by 0.043") and MEASUREMENT.search(" 17.7 against 14.0 dB")
    assert MEASUREMENT.search(" each step 5-10 s instead of 0.13 s")
    assert not MEASUREMENT.search(" lr 5e-4 x batch/512, 300 epochs, crop 768")


def test_no_file_cites_an_issue_number():
    pattern = re.compile(r"\bissue \d")
    places = [ROOT / "README.md", *(p for d in ("configs", "docs", "visiontf", "tools", "tests", "benchmarks")
                                    for p in sorted((ROOT / d).rglob("*")) if p.suffix in {".py", ".md", ".yaml"})]
    found = [f"{p.relative_to(ROOT)}:{i}" for p in places if p.is_file()
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"'issue N' names a tracker this repository does not have: {found}"
