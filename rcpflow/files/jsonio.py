"""Strict JSON for the files rcpflow is handed (manifests, summaries): what counts as JSON input.

A key twice in one object, ``NaN``/``Infinity``, integers beyond 64 bits, floats that overflow,
too deep a nesting and bytes that are not UTF-8 are each `JSONInputError`, naming the file and
the line (why: docs/design.md, verification of foreign inputs). `strict=False` keeps only the
depth limit, for MLLOG lines, which are judged as the official parser reads them.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

MAX_DEPTH = 64
INT64_MAX = 2**63 - 1

# One token of JSON text: a string, a structural character, or a bare word (number, literal).
# Only used to find where a problem is; `json.loads` decides what is valid syntax.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+', re.DOTALL)
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_NON_FINITE = frozenset({"NaN", "Infinity", "-Infinity"})


class JSONInputError(ValueError):
    """Input that is not acceptable JSON; the message names the file and the line."""


def decode_utf8(data: bytes, where: str) -> str:
    """`data` as UTF-8 text, or JSONInputError naming the line and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise JSONInputError(
            f"{where}: line {line}: not UTF-8 (byte 0x{data[e.start]:02x} at column {column})"
        ) from e


def loads(
    text: str,
    where: str,
    *,
    first_line: int = 1,
    strict: bool = True,
    max_depth: int = MAX_DEPTH,
    allow_nan: bool = False,
) -> Any:
    """The JSON value in `text`. `first_line` is the file line `text` starts on (for the
    messages, when `text` is one line of a JSON Lines file). `allow_nan` (with `strict`) lets
    ``NaN``/``Infinity`` through, for foreign records whose unused fields may hold them: the
    reader then refuses them where it uses a number."""
    if text.count("{") + text.count("[") > max_depth:  # else it cannot be too deep
        problem = _scan(text, max_depth, strict=False)
        if problem is not None:
            raise JSONInputError(_at(where, text, problem, first_line))
    try:
        # The hooks only detect; the slow scan below finds where (the error path only).
        hooks = (_LAX_NUMBER_HOOKS if allow_nan else _STRICT_HOOKS) if strict else {}
        return json.loads(text, **hooks)
    except json.JSONDecodeError as e:
        line = first_line + e.lineno - 1
        raise JSONInputError(f"{where}: line {line}: not JSON ({e.msg}, column {e.colno})") from e
    except (_Refused, ValueError) as e:
        problem = _scan(text, max_depth, strict, allow_nan)
        what = _at(where, text, problem, first_line) if problem else f"{where}: {e}"
        raise JSONInputError(what) from e


class _Refused(Exception):
    """Raised by a parse hook: the value is valid Python JSON but not acceptable input."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _Refused("duplicate key")
    return d


def _constant(name: str) -> Any:
    raise _Refused(name)


def _int(text: str) -> int:
    if len(text) > 20 or abs(int(text)) > INT64_MAX:
        raise _Refused(text)
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Refused(text)
    return value


# `allow_nan` keeps the duplicate-key and integer checks; the strict hooks add NaN/Infinity and
# floats that overflow to infinity.
_LAX_NUMBER_HOOKS: dict[str, Any] = {"object_pairs_hook": _object, "parse_int": _int}
_STRICT_HOOKS: dict[str, Any] = {
    **_LAX_NUMBER_HOOKS,
    "parse_constant": _constant,
    "parse_float": _float,
}


def load_bytes(data: bytes, where: str) -> Any:
    """`loads` of UTF-8 bytes (a whole JSON file)."""
    return loads(decode_utf8(data, where), where)


class _Problem(NamedTuple):
    pos: int
    what: str


def _at(where: str, text: str, problem: _Problem, first_line: int) -> str:
    line = first_line + text.count("\n", 0, problem.pos)
    return f"{where}: line {line}: {problem.what}"


def _scan(text: str, max_depth: int, strict: bool, allow_nan: bool = False) -> _Problem | None:
    """The first problem json.loads would not report; too deep a nesting first."""
    # Per open container: the keys seen so far (an object) or None (an array).
    stack: list[set[str] | None] = []
    expect_key = False
    found: _Problem | None = None
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok == "{" or tok == "[":
            stack.append(set() if tok == "{" else None)
            if len(stack) > max_depth:
                return _Problem(m.start(), f"nested deeper than {max_depth} levels")
            expect_key = tok == "{"
            continue
        if tok == "}" or tok == "]":
            if stack:
                stack.pop()
            expect_key = False
            continue
        if tok == ",":
            expect_key = bool(stack) and stack[-1] is not None
            continue
        if tok == ":":
            expect_key = False
            continue
        keys = stack[-1] if stack else None
        if strict and found is None:
            if expect_key and keys is not None and tok.startswith('"'):
                try:
                    key = json.loads(tok)
                except ValueError:
                    key = None  # a bad escape: json.loads reports it
                if key in keys:
                    found = _Problem(m.start(), f"duplicate key {key!r} in one object")
                elif isinstance(key, str):
                    keys.add(key)
            elif not tok.startswith('"'):
                found = _number_problem(tok, m.start(), allow_nan)
        expect_key = False
    return found


def _number_problem(tok: str, pos: int, allow_nan: bool = False) -> _Problem | None:
    if tok in _NON_FINITE:
        return None if allow_nan else _Problem(pos, f"{tok} is not a JSON number")
    if _INT.fullmatch(tok):
        if len(tok) > 20 or abs(int(tok)) > INT64_MAX:
            shown = tok if len(tok) <= 24 else f"{tok[:20]}... ({len(tok)} digits)"
            return _Problem(pos, f"integer {shown} is out of the 64-bit range")
        return None
    try:
        number = float(tok)
    except ValueError:
        return None  # not a number (true/false/null, or a syntax error json.loads names)
    if number in (float("inf"), float("-inf")) and not allow_nan:
        return _Problem(pos, f"number {tok} overflows a 64-bit float")
    return None
