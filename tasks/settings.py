"""Settings tables (TOML) read into frozen dataclasses, typed by the dataclass fields.

The keys a table may have are its dataclass's fields; the type of each value is the field's
annotation (`str`, `int`, `float` (finite: TOML's ``nan`` and ``inf`` are refused), `bool`,
`Literal[...]`, `X | None`, `tuple[str, ...]`, `Mapping[str, str]`, a Mapping of settings
dataclasses (a table of sub-tables), or a nested settings dataclass, read as a sub-table whose
missing keys keep the field's default). Every number is bounded before a dataclass sees it: an
`int` in [-2^31, 2^31) (every count, code and duration here; Kubernetes' int32), a `float` in
[-1e9, 1e9] (seconds: 31 years). What types cannot say (ranges, names) a dataclass checks
in ``__post_init__``, raising `SettingError` with the field's name; the reader prefixes the
table's dotted key, so every error names the key that holds the bad value.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


class SettingError(ValueError):
    """A setting is unknown, of the wrong type or out of range; `key` is its dotted key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where and key else where or key


def read_table(
    cls: type[T],
    table: object,
    where: str = "",
    *,
    base: T | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> T:
    """`cls` from `table`, keys left out taken from `base` (else the field defaults); `fixed`
    are fields that never come from a table. Raises SettingError naming the dotted key."""
    fixed = dict(fixed or {})
    if not isinstance(table, Mapping):
        raise SettingError(where, f"must be a table, got {type(table).__name__}")
    settable = [f for f in dataclasses.fields(cls) if f.name not in fixed]
    names = sorted(f.name for f in settable)
    unknown = sorted(str(k) for k in table if k not in names)
    if unknown:
        raise SettingError(
            where, f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(names)})"
        )
    hints = typing.get_type_hints(cls)
    values = {f.name: getattr(base, f.name) for f in settable} if base is not None else {}
    values.update(fixed)
    for f in settable:
        if f.name in table:
            values[f.name] = _value(hints[f.name], table[f.name], _join(where, f.name), f)
    try:
        return cls(**values)
    except SettingError as exc:
        raise SettingError(_join(where, exc.key), exc.problem) from None


def _value(hint: Any, value: object, key: str, f: dataclasses.Field[Any]) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        # TOML has no null: `X | None` only means that the key may be left out
        [inner] = [a for a in args if a is not type(None)]
        return _value(inner, value, key, f)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        default = _default(f)
        return read_table(hint, value, key, base=default if isinstance(default, hint) else None)
    if origin is Literal:
        if value not in args:
            raise SettingError(key, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin is tuple and args[1:] == (Ellipsis,):
        if not isinstance(value, list) or not all(_is(args[0], v) for v in value):
            raise SettingError(key, f"must be a list of {args[0].__name__}, got {value!r}")
        for item in value:
            _bounded(key, item)
        return tuple(value)
    if origin is Mapping:
        if not isinstance(value, Mapping):
            raise SettingError(key, f"must be a table, got {type(value).__name__}")
        if isinstance(args[1], type) and dataclasses.is_dataclass(args[1]):  # sub-tables
            return types.MappingProxyType(
                {
                    name: read_table(args[1], item, _join(key, str(name)))
                    for name, item in value.items()
                }
            )
        for name, item in value.items():
            if not _is(args[1], item):
                raise SettingError(
                    _join(key, str(name)),
                    f"must be {args[1].__name__}, got {type(item).__name__} {item!r}",
                )
        return types.MappingProxyType(dict(value))
    if isinstance(hint, type):
        if hint is float and isinstance(value, float) and not math.isfinite(value):
            raise SettingError(key, f"must be a finite number, got {value!r}")
        if not _is(hint, value):
            raise SettingError(
                key, f"must be {hint.__name__}, got {type(value).__name__} {value!r}"
            )
        _bounded(key, value)
        return hint(value)
    raise TypeError(f"{key}: a setting of type {hint!r} is not supported")


INT_RANGE = (-(2**31), 2**31 - 1)
FLOAT_LIMIT = 1e9


def _bounded(key: str, value: object) -> None:
    """Every number a setting takes is within a documented range (module docstring)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not INT_RANGE[0] <= value <= INT_RANGE[1]:
        raise SettingError(key, f"must be in {INT_RANGE[0]}..{INT_RANGE[1]}, got {value}")
    if isinstance(value, float) and not -FLOAT_LIMIT <= value <= FLOAT_LIMIT:
        raise SettingError(key, f"must be in [-{FLOAT_LIMIT:g}, {FLOAT_LIMIT:g}], got {value!r}")


def _default(f: dataclasses.Field[Any]) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _is(kind: type, value: object) -> bool:
    # bool is an int in Python, never a valid count or duration here; an int is a valid float;
    # TOML's nan and inf are never a valid setting
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    return isinstance(value, kind)
