"""Constructor arguments saved in a file (a checkpoint's hyper-parameters), read as plain data and checked
against the class's typed signature.

Why it exists: such arguments used to reach jsonargparse (LightningCLI's ``--ckpt_path`` merge, Lightning's
``_instantiator``). jsonargparse parses a string of an ``Any``-typed field as YAML or JSON and imports the class
any ``class_path`` in it names, so a file could run code, however its class path was spelled. Nothing here
parses, imports or calls anything the file names: each value is checked against the type the constructor
declares and handed on as it is, to be given to the constructor directly.

What passes:

* the declared types: ``str``, ``int``, ``float`` (an ``int`` is taken as a float), ``bool``, paths, ``None``,
  ``Literal``, unions, ``list``/``tuple``/``Sequence``/``dict``/``Mapping`` of those, and dataclasses (built
  here from a mapping of their fields: visiontf's typed option groups);
* under ``Any``: plain data only (``None``, ``bool``, ``int``, ``float``, ``str``, paths, and lists, tuples
  and string-keyed dicts of those).

What is refused, with the dotted key and the file: a value of another type; a key the constructor does not
take; and a class reference in any spelling, at any depth: a ``class_path``/``init_args`` key, or a string that
YAML or JSON would read as a document holding one. (The structure alone makes such values inert; refusing them
says plainly that the file is not what visiontf writes.)
"""
from __future__ import annotations

import argparse
import collections.abc
import contextvars
import dataclasses
import functools
import inspect
import numbers
import reprlib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import Any

from visiontf.core.errors import UserError

#: the keys that make a mapping a class specification to jsonargparse, LightningCLI and Lightning
CLASS_SPEC_KEYS = frozenset({"class_path", "_class_path", "init_args", "dict_kwargs", "_instantiator"})
#: strings longer than this are not read as YAML/JSON documents (they are inert either way: nothing parses them)
_LONGEST_DOCUMENT = 100_000
#: nesting deeper than this is not what any constructor of visiontf takes
_DEEPEST = 32
#: values visited in one section of a file, shared ones counted each time they are reached: a pickle can hold one list
#: twice at every level and a YAML string can alias one list many times, so a few hundred bytes can stand for 2 ** 30
#: values; visiontf's largest sections (a data set's class names and ids) hold tens of thousands
_MOST_VALUES = 200_000
_visits: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("saved_argument_visits", default=None)
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxother = 4, 120, 120


class SavedArgumentsError(UserError, ValueError):
    """Saved constructor arguments that are not plain data of the declared types; the message names the
    file, the dotted key and what was found."""


class _Mismatch(Exception):
    """A value that does not conform (internal: the caller adds the key and the file)."""


class _TooMany(Exception):
    """More than :data:`_MOST_VALUES` values visited (internal: the outermost call adds the key and the file)."""


def _visit() -> None:
    counter = _visits.get()
    if counter is not None:
        counter[0] += 1
        if counter[0] > _MOST_VALUES:
            raise _TooMany


def _one_walk(where: str, key: str, walk: Any, *args: Any) -> Any:
    """``walk(*args)`` as one counted walk of the values under ``key`` of ``where`` (the file); a walk inside
    another is counted with it."""
    if _visits.get() is not None:
        return walk(*args)
    token = _visits.set([0])
    try:
        return walk(*args)
    except _TooMany:
        raise SavedArgumentsError(
            f"{where}: {key} holds more than {_MOST_VALUES:,} values, counting each time a shared one is reached "
            "(references repeated in the pickle, or YAML anchors and aliases, that expand into more data than visiontf "
            "ever writes), so the file was refused before anything was built; use a checkpoint written by visiontf's "
            "tools/train.py") from None
    finally:
        _visits.reset(token)


def expands_beyond(value: Any, most: int = _MOST_VALUES) -> bool:
    """Whether ``value`` holds more than ``most`` values, a shared one counted each time it is reached (YAML anchors
    and aliases: a few hundred bytes that stand for 10 ** 9 strings once a reader copies them out)."""
    stack, seen = [value], 0
    while stack:
        current = stack.pop()
        seen += 1
        if seen > most:
            return True
        if isinstance(current, Mapping):
            stack.extend(current.values())
        elif isinstance(current, (list, tuple)):
            stack.extend(current)
    return False


def short_repr(value: Any) -> str:
    """``value``'s repr, bounded: at most 120 characters, and built without walking all of a value that expands."""
    # reprlib's bounded repr: a full repr of a value that expands (see _MOST_VALUES) would never end
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _fail(where: str, key: str, value: Any, why: str) -> SavedArgumentsError:
    return SavedArgumentsError(f"{where}: {key} is {short_repr(value)}, {why}; visiontf reads a file's saved arguments as "
                               "plain data, so the file was refused before anything was built; use a checkpoint "
                               "written by visiontf's tools/train.py")


@functools.lru_cache(maxsize=1)
def _yaml_readers() -> tuple[type, ...]:
    """PyYAML's safe reader, and the same without timestamps, as jsonargparse reads a value: a string with an
    impossible date (``2001-13-45``) fails the first and reads as a document with the second."""
    import yaml

    class WithoutTimestamps(yaml.SafeLoader):
        pass

    WithoutTimestamps.yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    return yaml.SafeLoader, WithoutTimestamps


def _names_a_class_key(text: str) -> bool:
    return any(key in text for key in CLASS_SPEC_KEYS)


#: what :func:`_embedded_document` gives for a string it cannot read that may spell a class specification
_UNREADABLE = object()


@functools.lru_cache(maxsize=1024)
def _embedded_document(text: str) -> Any:
    """What YAML (a superset of JSON) reads from ``text`` when that is a mapping or a list (a list of what each of
    :func:`_yaml_readers` reads), else None; :data:`_UNREADABLE` for a string none of them reads that names a class
    specification's key, or one too long to read that names one or holds an escape (cached: a string a file repeats is read once;
    callers only read the result)."""
    import yaml

    if len(text) > _LONGEST_DOCUMENT:
        return _UNREADABLE if _names_a_class_key(text) or "\\" in text else None
    documents, read = [], False
    for reader in _yaml_readers():
        try:
            loaded = yaml.load(text, Loader=reader)  # noqa: S506 - safe readers only (SafeLoader and a subclass)
        except Exception:  # noqa: BLE001 - not a document to this reader
            continue
        read = True
        if isinstance(loaded, (dict, list)):
            documents.append(loaded)
    if documents:
        return documents
    return _UNREADABLE if not read and _names_a_class_key(text) else None


def _class_reference(value: Any, depth: int = 0) -> str | None:
    """The dotted key of a class specification under ``value`` (in a string read as YAML/JSON too), or None."""
    _visit()
    if depth > _DEEPEST:
        return ""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, str):
        document = _embedded_document(value)
        if document is None:
            return None
        if document is _UNREADABLE:
            return "<as YAML>"
        for each in document:
            found = _class_reference(each, depth + 1)
            if found is not None:
                return f"<as YAML>{found}"
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k in CLASS_SPEC_KEYS:
                return f".{k}"
            found = _class_reference(v, depth + 1)
            if found is not None:
                return f".{k}{found}"
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _class_reference(v, depth + 1)
            if found is not None:
                return f"[{i}]{found}"
    return None


def class_reference(value: Any) -> str | None:
    """The dotted key (``.model_kwargs.backbone.class_path``) of the first class specification under ``value``, in
    any spelling :func:`plain_data` refuses (a string YAML or JSON reads as one too), or None."""
    return _class_reference(value)


def _plain_data(value: Any, where: str, key: str, depth: int = 0) -> Any:
    _visit()
    if depth > _DEEPEST:
        raise _fail(where, key, value, f"nested deeper than {_DEEPEST} levels")
    if value is None or isinstance(value, (bool, int, float, PurePath)):
        return value
    if isinstance(value, str):
        if _class_reference(value) is not None:
            raise _fail(where, key, value, "a class specification written as a YAML or JSON string, not plain data")
        return value
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _fail(where, key, value, f"a mapping with the key {short_repr(k)}, where plain data has string keys")
            if k in CLASS_SPEC_KEYS:
                raise _fail(where, f"{key}.{k}", v, "a class specification, not plain data")
            out[k] = _plain_data(v, where, f"{key}.{k}", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        items = [_plain_data(v, where, f"{key}[{i}]", depth + 1) for i, v in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) else items
    raise _fail(where, key, value, f"a {type(value).__module__}.{type(value).__qualname__}, not plain data "
                "(None, bools, numbers, strings, paths, and lists and string-keyed mappings of those)")


def plain_data(value: Any, where: str, key: str) -> Any:
    """``value`` if it is plain data without a class reference (argparse Namespaces become dicts), else
    :class:`SavedArgumentsError` naming ``where`` (the file) and ``key``."""
    return _one_walk(where, key, _plain_data, value, where, key)


def _conform(value: Any, hint: Any, where: str, key: str) -> Any:
    """``value`` as a ``hint``-typed constructor argument, or :class:`_Mismatch`."""
    _visit()
    if hint is Any or hint is object or hint is inspect.Parameter.empty:
        return _plain_data(value, where, key)
    if hint is None or hint is type(None):
        if value is None:
            return None
        raise _Mismatch
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        for arm in args:
            try:
                return _conform(value, arm, where, key)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is typing.Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise _Mismatch
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    # numbers of any library (numpy's: settings given in Python), an integral float as an int
    if hint is int:
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
            return int(value)
        raise _Mismatch
    if hint is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if hint is str:
        if isinstance(value, str):
            return _plain_data(value, where, key)
        raise _Mismatch
    if inspect.isclass(hint) and issubclass(hint, PurePath):
        if isinstance(value, (str, PurePath)):
            return _plain_data(value, where, key)
        raise _Mismatch
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if dataclasses.is_dataclass(hint) and inspect.isclass(hint):
        return _dataclass(value, hint, where, key)
    container = origin if origin is not None else hint
    if container in (list, tuple, collections.abc.Sequence, collections.abc.MutableSequence):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if container is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_conform(v, args[0], where, f"{key}[{i}]") for i, v in enumerate(value))
            if args and len(args) != len(value):
                raise _Mismatch
            return tuple(_conform(v, a, where, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args or [Any] * len(value))))
        item = args[0] if args else Any
        return [_conform(v, item, where, f"{key}[{i}]") for i, v in enumerate(value)]
    if container in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        if not isinstance(value, Mapping):
            raise _Mismatch
        key_hint, value_hint = args if len(args) == 2 else (Any, Any)
        out = {}
        for k, v in value.items():
            if k in CLASS_SPEC_KEYS:
                raise _fail(where, f"{key}.{k}", v, "a class specification, not plain data")
            try:
                _conform(k, key_hint, where, f"{key} (a key)")
            except _Mismatch:
                raise _fail(where, key, value, f"a mapping with the key {short_repr(k)}, not {type_name(key_hint)}") from None
            out[k] = _check_value(v, value_hint, where, f"{key}.{k}")
        return out
    # a class, a callable, a tensor: nothing a saved file may hold as a constructor argument
    raise _Mismatch


def _dataclass(value: Any, hint: type, where: str, key: str) -> Any:
    if isinstance(value, hint):
        return value
    if not isinstance(value, Mapping):
        raise _Mismatch
    hints = typing.get_type_hints(hint)
    names = {f.name for f in dataclasses.fields(hint) if f.init}
    unknown = [k for k in value if k not in names]
    if unknown:
        raise _fail(where, f"{key}.{unknown[0]}", value[unknown[0]], f"not a field of {hint.__name__} "
                    f"(its fields: {', '.join(sorted(names))})")
    fields_ = {k: _check_value(v, hints.get(k, Any), where, f"{key}.{k}") for k, v in value.items()}
    try:
        return hint(**fields_)
    except (ValueError, TypeError) as e:  # the section's own checks (its __post_init__), named with the file
        raise SavedArgumentsError(f"{where}: {key} is {short_repr(value)}: {e}") from None


def type_name(hint: Any) -> str:
    """``hint`` as a message names it (``int``, ``tuple[float, ...]``, ``str | None``, ``one of 'a', 'b'``)."""
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    text = getattr(hint, "__name__", None) if typing.get_origin(hint) is None else None
    return text or str(hint).replace("typing.", "")


def _check_value(value: Any, hint: Any, where: str, key: str) -> Any:
    try:
        return _conform(value, hint, where, key)
    except _Mismatch:
        raise _fail(where, key, value, f"not {type_name(hint)}") from None


class NotOfType(ValueError):
    """A value that is not of its declared type (:func:`as_declared`)."""


def as_declared(value: Any, hint: Any) -> Any:
    """``value`` as a ``hint``-typed value by :func:`check_value`'s rules (an integral float an int, a list a tuple
    where one is declared) for a config's field, not a file's; :class:`NotOfType` when it is not one."""
    try:
        return _one_walk("", "", _conform, value, hint, "", "")
    except (_Mismatch, SavedArgumentsError):
        raise NotOfType(f"{short_repr(value)} is not {type_name(hint)}") from None


def check_value(value: Any, hint: Any, where: str, key: str) -> Any:
    """``value`` as a ``hint``-typed argument (see the module docstring), or :class:`SavedArgumentsError`
    naming ``where`` (the file) and ``key``."""
    return _one_walk(where, key, _check_value, value, hint, where, key)


def check_arguments(cls: type, arguments: Mapping[str, Any], where: str, section: str,
                    ignored: Iterable[str] = ()) -> dict[str, Any]:
    """``arguments`` (saved for ``cls``'s constructor) checked against its typed signature, as the keyword
    arguments to call it with; :class:`SavedArgumentsError` naming ``where`` (the file) and ``section.key``
    for a value of another type, a class reference, or a key the constructor does not take. ``ignored``: keys
    left out without a check (names a class once took, which its loader reports itself)."""
    signature = inspect.signature(cls.__init__)
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001 - unresolvable annotations: every value must then be plain data
        hints = {}
    params = {n: p for n, p in signature.parameters.items() if n != "self"
              and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    ignored = set(ignored)
    out: dict[str, Any] = {}
    for name, value in arguments.items():
        key = f"{section}.{name}"
        if name in ignored:
            continue
        if name in CLASS_SPEC_KEYS:
            raise _fail(where, key, value, "a class specification, not a constructor argument")
        if name not in params and not takes_any:
            raise _fail(where, key, value, f"not an argument of {cls.__name__} (it takes {', '.join(params)})")
        out[name] = _one_walk(where, key, _check_value, value, hints.get(name, Any), where, key)
    return out


def label_table(value: Any, where: str, key: str) -> dict[int, int]:
    """A saved ``label -> category id`` table (integer labels, or their strings as JSON writes them, to integers) with
    integer keys, or :class:`SavedArgumentsError` naming ``where`` (the file) and ``key``."""
    table = check_value(value, dict[int | str, int], where, key)
    try:
        labels = {int(k): v for k, v in table.items()}
    except ValueError:
        raise SavedArgumentsError(f"{where}: {key}'s keys are the model's labels as integers, found {list(table)[:3]}; "
                                  "use a file written by visiontf") from None
    negative = [(k, v) for k, v in labels.items() if k < 0 or v < 0]
    if negative:
        raise SavedArgumentsError(f"{where}: {key} maps label {negative[0][0]} to category id {negative[0][1]}; labels and "
                                  "category ids are never negative; use a file written by visiontf")
    seen: dict[int, int] = {}
    for label, cat in labels.items():
        if cat in seen:  # the detections of both labels would be written as one category: nothing tells them apart
            raise SavedArgumentsError(f"{where}: {key} maps labels {seen[cat]} and {label} both to category id {cat}; each "
                                      "label is its own category; use a file written by visiontf")
        seen[cat] = label
    return labels


__all__ = ["CLASS_SPEC_KEYS", "SavedArgumentsError", "check_arguments", "class_reference", "expands_beyond", "check_value", "label_table", "plain_data",
           "type_name"]
