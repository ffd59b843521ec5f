"""Record: a frozen dataclass that writes itself as a JSON object and reads itself back.

    @dataclass(frozen=True)
    class Window(Record):
        index: int
        server_ms: dict[str, float] | None = field(default=None, metadata=written(omit_none=True))

    Window(0, None).to_dict()                    # {"index": 0}
    Window.read(Fields({"index": 0}, "w.json"))  # Window(index=0, server_ms=None)

This is the one writer and reader of the result documents (:mod:`tradeoff.results`). Every
field is written under its own name, in order: records nested, lists and dicts copied, tuples
as lists, integer dict keys as strings (as JSON has them). A ``schema`` and a ``search``
class attribute, where a document has them, come first. Reading follows each field's
annotation back: a nested record, a list or dict of records, a tuple, an integer key; a
field without a default must be there, else :class:`ResultFormatError` names the file and the
field. A float that is not finite (an overloaded deployment's predicted p99) is written as
the string ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``, as protobuf's JSON mapping does, so
the file stays JSON. Each value read is checked against its annotation on the way: an ``int`` is an
integer and not a boolean, a ``float`` any number, a ``str`` a string, a ``bool`` true or
false, an integer key a number, ``Any`` anything (null stays allowed wherever it was). A
result file passed between people cannot put a string where the report prints a number; the
error names the file, the field and the value, cut short. A figure derived from the others
that the document also records is a field with ``init=False`` set in ``__post_init__``:
written, never read. :func:`written` says how the rest differ.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tradeoff.errors import ResultFormatError, shown

__all__ = ["Fields", "Record", "written"]

_OPTIONS = "tradeoff.record"
_R = TypeVar("_R", bound="Record")


class Fields:
    """Reads the fields of one JSON object, naming where a missing one was expected."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise ResultFormatError(f"{where}: expected an object, got {type(data).__name__}")
        self.data = data
        self.where = where

    def __call__(self, key: str) -> Any:
        try:
            return self.data[key]
        except KeyError:
            raise ResultFormatError(f"{self.where}: field {key!r} is missing") from None

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def has(self, key: str) -> bool:
        return key in self.data

    def sub(self, key: str) -> Fields:
        return Fields(self(key), _key_where(self.where, key))

    def typed(self, key: str, hint: Any) -> Any:
        """The field ``key`` read as the annotation ``hint`` has it, its type checked (a
        reader written by hand checks its fields as the generic one does)::

            name = f.typed("name", str)
        """
        return _read(hint, self(key), _key_where(self.where, key))


@dataclass(frozen=True)
class _Options:
    omit_none: bool = False
    when: Callable[[Any], bool] | None = None
    flat: str | None = None
    reader: Callable[[Fields], Any] | None = None
    never: bool = False
    required: bool = False


def written(*, omit_none: bool = False, when: Callable[[Any], bool] | None = None,
            flat: str | None = None, reader: Callable[[Fields], Any] | None = None,
            never: bool = False, required: bool = False) -> dict[str, Any]:
    """Field metadata (``dataclasses.field(metadata=written(...))``) for a field written
    otherwise than plainly.

    - ``omit_none``: left out while None.
    - ``when``: written only when ``when(record)`` is true (a field that goes with another).
    - ``flat``: a nested record written into this object's own keys; read back when the
      key ``flat`` is there, else None.
    - ``reader``: reads the field from this object's :class:`Fields` instead.
    - ``never``: not written (``reader`` gives it back from what was).
    - ``required``: must be in the file although the field has a default.
    """
    return {_OPTIONS: _Options(omit_none, when, flat, reader, never, required)}


class Record:
    """A frozen dataclass of a result document: ``to_dict()`` and ``read()`` come from its
    fields (see the module docstring)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {key: getattr(self, key) for key in ("schema", "search")
                               if hasattr(type(self), key)}
        for item in _layout(type(self)):
            value = getattr(self, item.name)
            options = item.options
            if options.never or (options.omit_none and value is None) or \
                    (options.when is not None and not options.when(self)):
                continue
            if options.flat is not None:
                if value is not None:
                    out.update(value.to_dict())
                continue
            out[item.name] = _plain(value)
        return out

    @classmethod
    def read(cls: type[_R], f: Fields) -> _R:
        values: dict[str, Any] = {}
        for item in _layout(cls):
            if not item.init:
                continue
            options = item.options
            if options.reader is not None:
                values[item.name] = options.reader(f)
            elif options.flat is not None:
                values[item.name] = _record_type(item.hint).read(f) if f.has(options.flat) \
                    else None
            elif f.has(item.name) or item.required:
                values[item.name] = _read(item.hint, f(item.name), f"{f.where}.{item.name}")
        return cls(**values)


@dataclass(frozen=True)
class _Item:
    name: str
    hint: Any
    init: bool
    required: bool
    options: _Options


_LAYOUTS: dict[type, tuple[_Item, ...]] = {}


def _layout(cls: type) -> tuple[_Item, ...]:
    """The fields of ``cls`` with their resolved annotations and options (kept per class)."""
    if cls in _LAYOUTS:
        return _LAYOUTS[cls]
    hints = typing.get_type_hints(cls)
    items = []
    for f in dataclasses.fields(cls):
        options = f.metadata.get(_OPTIONS, _Options())
        has_default = f.default is not dataclasses.MISSING or \
            f.default_factory is not dataclasses.MISSING
        items.append(_Item(f.name, hints[f.name], f.init, options.required or not has_default,
                           options))
    _LAYOUTS[cls] = tuple(items)
    return _LAYOUTS[cls]


# numbers JSON has no literal for, written as protobuf's JSON mapping writes them
_NOT_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _read(hint: Any, value: Any, where: str) -> Any:
    """``value`` as the annotation ``hint`` has it (JSON's lists, dicts and strings back to
    records, tuples and integer keys), its type checked on the way."""
    if value is None:
        return None
    hint = _without_none(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.read(Fields(value, where))
    if origin is list:
        return [_read(args[0], v, f"{where}[{i}]") for i, v in enumerate(_list(value, where))]
    if origin is tuple:
        items = _list(value, where)
        if not args or args[-1] is Ellipsis:
            return tuple(_read(args[0] if args else Any, v, f"{where}[{i}]")
                         for i, v in enumerate(items))
        if len(items) != len(args):
            raise ResultFormatError(f"{where}: expected {len(args)} items, got {len(items)}")
        return tuple(_read(a, v, f"{where}[{i}]")
                     for i, (a, v) in enumerate(zip(args, items, strict=True)))
    if origin is dict:
        return {_key(args[0], k, where): _read(args[1], v, _key_where(where, k))
                for k, v in Fields(value, where).data.items()}
    return _checked(hint, value, where)


# what a plain annotation takes from JSON, and how an error names it; a boolean is no number
_PLAIN: dict[Any, tuple[tuple[type, ...], str]] = {
    bool: ((bool,), "true or false"), int: ((int,), "an integer"),
    float: ((int, float), "a number"), str: ((str,), "a string")}


def _checked(hint: Any, value: Any, where: str) -> Any:
    """``value`` itself, once it is of the plain type ``hint`` names."""
    if hint not in _PLAIN:
        raise TypeError(f"a Record field annotated {hint!r} has no reader")
    kinds, name = _PLAIN[hint]
    if hint is float and isinstance(value, str) and value in _NOT_FINITE:
        return _NOT_FINITE[value]
    if not isinstance(value, kinds) or (hint is not bool and isinstance(value, bool)):
        raise ResultFormatError(f"{where}: expected {name}, got {shown(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ResultFormatError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _key(hint: Any, key: str, where: str) -> Any:
    """A JSON object's key as the dict's key annotation has it (an integer back from its
    text)."""
    if hint is not int:
        return key
    try:
        return int(key)
    except ValueError:
        raise ResultFormatError(f"{where}: key {shown(key)} is not an integer") from None


def _key_where(where: str, key: str) -> str:
    """Where a key's value sits, for an error: ``where.key``, or ``where['odd key']`` when
    the key would not read as one plain word (a file's key is shown, never echoed)."""
    plain = isinstance(key, str) and key.isascii() and len(key) <= 40 and \
        key.replace("_", "").replace("-", "").isalnum()
    return f"{where}.{key}" if plain else f"{where}[{shown(key)}]"


def _without_none(hint: Any) -> Any:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    return hint


def _record_type(hint: Any) -> type[Record]:
    kind = _without_none(hint)
    assert isinstance(kind, type) and issubclass(kind, Record), hint
    return kind
