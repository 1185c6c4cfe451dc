"""The one place where a command line turns a user's mistake into one line on stderr and exit code 2.

Every ``tools/*.py`` runs its ``main`` through :func:`run_tool`. A mistake the user can fix ends as

    predict.py: error: missing.jpg: file not found

(exit code 2); anything else is a bug and keeps its traceback. ``--debug`` anywhere on the command
line, or ``VISIONTF_DEBUG=1``, shows the traceback of a user mistake too.

What counts as a mistake, found anywhere in the exception's cause/context chain:

* a :class:`visiontf.core.errors.UserError` (bad data, annotations, weights, checkpoints, options);
* a command-line parsing error (argparse's, or jsonargparse's as LightningCLI raises it with
  ``exit_on_error=False``): unknown or abbreviated options, values of the wrong type, missing config
  files. jsonargparse wraps the real cause of a failed class instantiation in "Does not validate
  against any of the Union subtypes" with one error per subtype; the cause is taken from the chain,
  or else the first subtype error that is not "Expected a <class 'NoneType'>";
* a missing file or folder, or one that cannot be read or written (``FileNotFoundError``,
  ``NotADirectoryError``, ``IsADirectoryError``, ``PermissionError``).

Standard library only (the results-file evaluator runs through it without importing torch).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from visiontf.core.errors import UserError

#: environment variable that shows tracebacks of user mistakes (as ``--debug`` does)
DEBUG_ENV = "VISIONTF_DEBUG"

_FILE_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
_UNION = "Does not validate against any of the Union subtypes"
_NONE_TYPE = re.compile(r"^Expected a <class 'NoneType'>")
_WORKER = "Original Traceback (most recent call last):"

__all__ = ["DEBUG_ENV", "debug_enabled", "run_tool", "user_message"]


def debug_enabled() -> bool:
    """True when ``VISIONTF_DEBUG`` asks for tracebacks (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or while handling, nearest first."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend([e.__cause__, e.__context__])


def _one_line(text: str) -> str:
    """A message on one line; a DataLoader worker's re-raised error keeps only its own last line."""
    if _WORKER in text:
        last = [ln for ln in text.splitlines() if ln.strip()][-1]
        text = re.sub(r"^[\w.]+(Error|Exception): ", "", last.strip())
    return " ".join(text.split())


def _items(text: str) -> list[str]:
    """The innermost error items of a jsonargparse message ("- ..." lines with their continuation lines)."""
    items: list[tuple[int, str]] = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("Given value", "Subtypes:", "Errors:", _UNION, "- " + _UNION)):
            continue
        indent = len(line) - len(line.lstrip())
        if s.startswith("- "):
            items.append((indent, s[2:]))
        elif items and indent > items[-1][0]:
            items[-1] = (items[-1][0], items[-1][1] + " " + s)
    useful = [(indent, t) for indent, t in items if not _NONE_TYPE.match(t)]
    # the innermost error first; "Expected a path but X either not accessible or invalid" is the file-path
    # reading of a value, rarely the point
    useful.sort(key=lambda it: (-it[0], it[1].startswith("Expected a path but")))
    return [t for _, t in useful]


def _type_phrase(text: str) -> str:
    """jsonargparse's type wording in plain words: "Expected a <class 'int'>" -> "expected an int"."""
    def literal(m: re.Match) -> str:
        return "expected one of " + m.group(1).replace("'", "")

    text = re.sub(r"Expected a typing\.Literal\[(.*?)\]", literal, text)
    text = re.sub(r"Expected a <class '(?:[\w.]+\.)?(\w+)'>", lambda m: f"expected {'an' if m.group(1)[0] in 'aeiou' else 'a'} {m.group(1)}", text)
    return text.replace(". Got value:", ", got")


def _argument_message(text: str) -> str:
    """A jsonargparse/argparse parsing error on one line, naming the option as the command line spells it.

    ``Parser key "model": ... class_path '...DetectionTask': Parser key "schedule": Expected a
    typing.Literal['step', 'cosine']. Got value: foo`` -> ``--model.init_args.schedule: expected one of
    step, cosine, got foo``.
    """
    keys = re.findall(r'Parser key "([^"]+)"', text)
    class_path = re.search(r"Problem with given class_path '([^']+)'", text)
    given = re.search(r"^\s*Given value: (.+)$", text, flags=re.M)
    given_value = given.group(1).strip() if given else None
    if given_value and given_value.startswith(("Namespace(", "NestedArg(")):
        given_value = None
    if not keys:
        return _one_line(text)
    option = "--" + keys[0]
    if class_path and len(keys) > 1:
        option += ".init_args." + keys[-1]
    elif len(keys) > 1:
        option += "." + ".".join(keys[1:])
    items = _items(text) if _UNION in text or "\n  - " in text or text.lstrip().startswith("- ") else []
    body = items[0] if items else text.rsplit(f'Parser key "{keys[-1]}":', 1)[-1]
    body = re.sub(r"^.*Parser key \"[^\"]+\":\s*", "", body)  # the innermost key's own message
    body = re.sub(r"^Problem with given class_path '[^']+':\s*", "", body)
    not_accepted = re.match(r"Option '([^']+)' is not accepted", body.strip())
    if not_accepted and class_path:
        option = f"--{keys[0]}.init_args.{not_accepted.group(1)}"
        body = f"not an option of {class_path.group(1).rsplit('.', 1)[-1]}{_close_init_args(class_path.group(1), not_accepted.group(1))}"
    body = _type_phrase(body.strip())
    if given_value and "got" not in body and given_value not in body:
        body += f", got {given_value}"
    return _one_line(f"{option}: {body}")


def _close_init_args(class_path: str, name: str) -> str:
    """"; did you mean --...root?" from the class's constructor arguments (the class is imported already:
    looked up in ``sys.modules``, never imported, since a message may quote a checkpoint's class path)."""
    import difflib
    import inspect

    try:
        module, cls = class_path.rsplit(".", 1)
        params = list(inspect.signature(getattr(sys.modules[module], cls)).parameters)
    except Exception:  # noqa: BLE001 - a hint only
        return ""
    close = difflib.get_close_matches(name, params, n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def user_message(exc: BaseException) -> str | None:
    """The one-line message of a user mistake, or None when ``exc`` is a bug (see the module docstring)."""
    chain = list(_chain(exc))
    for e in chain:
        if isinstance(e, UserError):
            return _one_line(str(e))
    for e in chain:
        if isinstance(e, argparse.ArgumentError):
            return _argument_message(str(e))
    for e in chain:
        if isinstance(e, _FILE_ERRORS):
            return _one_line(str(e))
    for e in chain:
        # Lightning's refusal of a Trainer setting (devices 0, a GPU accelerator without a GPU, max_steps -5):
        # the user's configuration, named by Lightning; matched by name so that this module never imports it
        if type(e).__name__ == "MisconfigurationException" and type(e).__module__.startswith(("lightning", "pytorch_lightning")):
            text = _one_line(str(e))
            if "gpu" in text.lower() or "cuda" in text.lower():  # a GPU recipe (the COCO configs) on a machine without one
                text += (" (the config asks for GPUs; on a CPU add --trainer.accelerator cpu --trainer.devices 1 "
                         "--trainer.strategy auto)")
            return text
    for e in chain:
        # an accelerator, strategy, devices or precision setting the Trainer does not take: Lightning says so in a plain
        # ValueError or TypeError, told apart from a bug by where it was raised
        if isinstance(e, (ValueError, TypeError)) and _raised_in(e, _TRAINER_SETTING_CHECKS):
            return _one_line(str(e))
    # anything else, including a class jsonargparse could not build for another reason, is a bug
    return None


#: the modules (and packages) where Lightning checks the Trainer's accelerator, strategy, devices and precision
_TRAINER_SETTING_CHECKS = ("lightning.pytorch.trainer.connectors.accelerator_connector", "lightning.fabric.connector",
                           "lightning.fabric.accelerators.", "lightning.pytorch.accelerators.",
                           "lightning.fabric.utilities.device_parser")


def _raised_in(exc: BaseException, modules: tuple[str, ...]) -> bool:
    """Whether ``exc`` was raised by code of one of ``modules`` (its traceback's innermost frame; a name ending in a
    dot is a package: any module below it)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    name = tb.tb_frame.f_globals.get("__name__", "")
    return any(name.startswith(m) if m.endswith(".") else name == m for m in modules)


def run_tool(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run a tool's ``main(argv)``; a user mistake becomes ``<prog>: error: <message>`` and exit code 2.

    ``--debug`` is taken out of ``argv`` and sets ``VISIONTF_DEBUG=1`` (for this process and the ones
    it starts, e.g. DDP ranks), so the traceback is shown.
    """
    from_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv:
        argv = [a for a in argv if a != "--debug"]
        os.environ[DEBUG_ENV] = "1"
        if from_process:
            sys.argv[1:] = argv  # DDP launchers start the other ranks with sys.argv
    prog = prog or Path(sys.argv[0]).name
    try:
        code = main(argv)
    except KeyboardInterrupt:
        sys.stderr.write(f"\n{prog}: interrupted\n")
        return 130
    except Exception as e:
        message = None if debug_enabled() else user_message(e)
        if message is None:
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stderr.write(f"{prog}: error: {message}\n")
        sys.stderr.flush()
        return 2
    return 0 if code is None else int(code)
