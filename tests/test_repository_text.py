"""Text rules of the repository: configs hold settings with a one-line why (measurements go to docs/),
the library's comments and docstrings say why without our own timings (they go to docs/record/), and
nothing cites an issue number of a tracker the repository does not have.

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


#: a timing, memory or speed-up that a run of ours produced ("takes 5 ms on a 2-core CPU", "1.5x faster",
#: "measured: +174 MiB"); published facts of the originals ("42.8 COCO AP, 2.12 ms on a T4") do not match
LOCAL_MEASUREMENT = re.compile(
    r"\d(?:\.\d+)?\s*(?:ms|s|MiB|MB|GB)\b[^.]*\b(?:here|took|takes|spent|cost|instead of)\b"
    r"|\b(?:took|takes|spent|cost)\b[^.]*\d(?:\.\d+)?\s*(?:ms|s|MiB|MB|GB)\b"
    r"|\d+(?:\.\d+)?\s*[x×]\s*(?:faster|slower)|(?:faster|slower)\b[^.]{0,30}\d+(?:\.\d+)?\s*[x×]"
    r"|\bmeasured\W{0,3}\s*[+-]?\d|\bon (?:a|one|this) (?:loaded |shared )?\d-core"
    r"|\d+(?:\.\d+)?\s*%\s*(?:faster|slower)|\d(?:\.\d+)?\s*(?:ms|s)\s+per\b")


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


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """The text after each "#" and every line of each triple-quoted string (docstrings, and a few messages)."""
    source = path.read_text()
    found = _comments(path)
    for m in re.finditer(r'"""(.*?)"""', source, re.S):
        first = source.count("\n", 0, m.start()) + 1
        found += [(first + i, line) for i, line in enumerate(m.group(1).splitlines())]
    return found


def test_library_comments_carry_no_measurement_of_ours():
    found = [f"{p.relative_to(ROOT)}:{i}: {text.strip()}" for p in sorted((ROOT / "visiontf").rglob("*.py"))
             for i, text in _comments_and_docstrings(p) if LOCAL_MEASUREMENT.search(text)]
    assert not found, ("say why in the code and put the number in docs/record/ (with its date, machine and command):\n"
                       + "\n".join(found))


def test_the_library_rule_catches_our_measurements_and_not_published_facts():
    for ours in ("takes 5 ms on a 2-core CPU instead of 21 ms", "made it 1.5x faster at batch 8", "(measured: +174 MiB peak",
                 "a 324-Mpx PNG cost 2.4 s and 310 MB here", "about 0.15 s per 400 MB", "about 20 % faster convolutions"):
        assert LOCAL_MEASUREMENT.search(ours), ours
    for fact in ("(42.8 COCO AP, 4 M parameters, 2.12 ms on a T4)", "back-off (2, 4, 8, 8 s)", "13.2 s/epoch  elapsed 1:59"):
        assert not LOCAL_MEASUREMENT.search(fact), fact


def test_no_file_cites_an_issue_number():
    pattern = re.compile(r"\bissue \d")
    places = [ROOT / "README.md", *(p for d in ("configs", "docs", "visiontf", "tools", "tests", "benchmarks")
                                    for p in sorted((ROOT / d).rglob("*")) if p.suffix in {".py", ".md", ".yaml"})]
    found = [f"{p.relative_to(ROOT)}:{i}" for p in places if p.is_file()
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"'issue N' names a tracker this repository does not have: {found}"
