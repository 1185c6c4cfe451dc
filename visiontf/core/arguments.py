"""argparse as every visiontf command line uses it: one option style, no abbreviations, mistakes as
:class:`~visiontf.core.errors.UsageError`.

* Options are spelled with underscores, as LightningCLI spells them (``--ckpt_path``, ``--score_threshold``);
  a dashed spelling (``--score-threshold``) is an unknown option whose error names the underscore one.
* Abbreviations are refused (``--score 0.5`` is not ``--score_threshold 0.5``): an abbreviation that
  works today silently changes meaning when an option is added.
* A parsing mistake raises :class:`UsageError` naming the option and, for an unknown one, the closest
  known options; :func:`visiontf.cli.errors.run_tool` prints it as one line and exits with code 2.

Standard library only, so every layer's ``main`` may use it without importing torch.
"""
from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable

from visiontf.core.errors import UsageError

__all__ = ["ToolParser", "close_options", "UsageError"]


def close_options(given: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known option strings closest to ``given``: those it abbreviates (``--score`` ->
    ``--score_threshold``), else the most similar (``--score-treshold`` -> ``--score_threshold``)."""
    name = given.split("=", 1)[0].replace("-", "_")
    known = sorted({k for k in known if k.startswith("--")})
    canon = {k.replace("-", "_"): k for k in known}
    prefixed = [c for c in canon if c.startswith(name) and len(name) > 3]
    hits = prefixed[:n] or difflib.get_close_matches(name, list(canon), n=n, cutoff=0.6)
    return [canon[h] for h in hits]


class ToolParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with visiontf's conventions (see the module docstring).

    ``--debug`` is listed in every tool's help; :func:`visiontf.cli.errors.run_tool` reads it (or
    ``VISIONTF_DEBUG=1``) and shows the full traceback of an error instead of one line.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true",
                          help="on an error, show the full traceback instead of one line (also VISIONTF_DEBUG=1)")

    def error(self, message: str):  # noqa: D401 - argparse's hook
        """Raise :class:`UsageError` (argparse would print the usage and exit)."""
        hint = ""
        if message.startswith("unrecognized arguments:"):
            unknown = [a for a in message.split(":", 1)[1].split() if a.startswith("-")]
            close = close_options(unknown[0], self._option_string_actions) if unknown else []
            if close:
                hint = f"; did you mean {' or '.join(close)}?"
        raise UsageError(f"{message}{hint} (see {self.prog} --help)")
