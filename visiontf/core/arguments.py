"""argparse as every visiontf command line uses it: one option style, no abbreviations, mistakes as
:class:`~visiontf.core.errors.UsageError`.

* Options are spelled with underscores, as LightningCLI spells them (``--ckpt_path``, ``--score_threshold``);
  a dashed spelling (``--score-threshold``) is an unknown option whose error names the underscore one.
* Abbreviations are refused (``--score 0.5`` is not ``--score_threshold 0.5``): an abbreviation that
  works today silently changes meaning when an option is added.
* A parsing mistake raises :class:`UsageError` naming the option and, for an unknown one, the closest
  known options; :func:`visiontf.cli.tool_errors.run_tool` prints it as one line and exits with code 2.

Standard library only, so every layer's ``main`` may use it without importing torch.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Sequence

from visiontf.core.errors import UsageError

__all__ = ["ToolParser", "UsageError", "close_options", "unknown_option_error", "unknown_options"]


def close_options(given: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known option strings closest to ``given``: those it abbreviates (``--score`` ->
    ``--score_threshold``), else the most similar (``--score-treshold`` -> ``--score_threshold``)."""
    name = given.split("=", 1)[0].replace("-", "_")
    known = sorted({k for k in known if k.startswith("--")})
    canon = {k.replace("-", "_"): k for k in known}
    prefixed = [c for c in canon if c.startswith(name) and len(name) > 3]
    hits = prefixed[:n] or difflib.get_close_matches(name, list(canon), n=n, cutoff=0.6)
    return [canon[h] for h in hits]


def unknown_options(argv: Iterable[str], known: Iterable[str], dotted: bool = True) -> list[str]:
    """The ``--name`` (or ``--name=value``) tokens of ``argv`` whose name is not in ``known``, up to a ``--``
    separator; ``dotted=False`` leaves out names with a dot (nested options a parser resolves by itself)."""
    known = set(known)
    found = []
    for arg in argv:
        if arg == "--":
            break
        if not arg.startswith("--") or len(arg) == 2:
            continue
        name = arg.split("=", 1)[0]
        if name not in known and (dotted or "." not in name):
            found.append(name)
    return found


def unknown_option_error(name: str, known: Iterable[str], prog: str | None = None) -> UsageError:
    """``unknown option --X; did you mean --Y?``: the one wording of every tool for an option it does not take."""
    close = close_options(name, known)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return UsageError(f"unknown option {name}{hint}" + (f" (see {prog} --help)" if prog else ""))


class ToolParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with visiontf's conventions (see the module docstring).

    ``--debug`` is listed in every tool's help; :func:`visiontf.cli.tool_errors.run_tool` reads it (or
    ``VISIONTF_DEBUG=1``) and shows the full traceback of an error instead of one line.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true",
                          help="on an error, show the full traceback instead of one line (also VISIONTF_DEBUG=1)")

    def unknown_options(self, argv: Sequence[str]) -> list[str]:
        """The options of ``argv`` this parser does not take (see :func:`unknown_options`)."""
        return unknown_options(argv, self._option_string_actions)

    def refuse_unknown_options(self, argv: Sequence[str]) -> None:
        """:func:`unknown_option_error` for the first option of ``argv`` this parser does not take."""
        unknown = self.unknown_options(argv)
        if unknown:
            raise unknown_option_error(unknown[0], self._option_string_actions, self.prog)

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - argparse's
        # an unknown option is named first: a misspelt --outptu would otherwise read as "--output is required"
        self.refuse_unknown_options(sys.argv[1:] if args is None else list(args))
        return super().parse_args(args, namespace)

    def error(self, message: str):  # noqa: D401 - argparse's hook
        """Raise :class:`UsageError` (argparse would print the usage and exit)."""
        if message.startswith("unrecognized arguments:"):
            unknown = [a for a in message.split(":", 1)[1].split() if a.startswith("-")]
            if unknown:
                raise unknown_option_error(unknown[0], self._option_string_actions, self.prog)
        raise UsageError(f"{message} (see {self.prog} --help)")
