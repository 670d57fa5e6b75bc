"""Strict JSON input: each refusal names the file and line; valid JSON reads as json does."""

import json

import pytest

from rcpflow.files import jsonio


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1,\n "b": 2,\n "a": 3}', "f: line 3: duplicate key 'a' in one object"),
        ('{"x": {"a": 1}, "y": [{"a": 1, "a": 1}]}', "f: line 1: duplicate key 'a'"),
        ('{"a": NaN}', "f: line 1: NaN is not a JSON number"),
        ("[1,\n-Infinity]", "f: line 2: -Infinity is not a JSON number"),
        ("[1e999]", "f: line 1: number 1e999 overflows a 64-bit float"),
        ("9223372036854775808", "f: line 1: integer 9223372036854775808 is out of the 64-bit"),
        ("1" * 5000, "(5000 digits) is out of the 64-bit range"),
        ("[" * 65 + "]" * 65, "f: line 1: nested deeper than 64 levels"),
        ('{"a": 1', "f: line 1: not JSON (Expecting ',' delimiter, column 8)"),
    ],
)
def test_refusals_name_the_line(text, message):
    with pytest.raises(jsonio.JSONInputError) as e:
        jsonio.loads(text, "f")
    assert message in str(e.value)


def test_first_line_offsets_the_messages():
    with pytest.raises(jsonio.JSONInputError, match="m: line 7: duplicate key 'k'"):
        jsonio.loads('{"k": 1, "k": 2}', "m", first_line=7)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": {"a": {"a": 1}}, "b": "\\"a\\": 1, \\"a\\": 2", "c": [1, 2.5, -3e10, null, true]}',
        "9223372036854775807",
        "[" * 64 + "]" * 64,
        '"{[,:\\u00e9"',
    ],
)
def test_valid_json_reads_as_json_does(text):
    assert jsonio.loads(text, "f") == json.loads(text)


def test_lenient_mode_keeps_only_the_depth_limit():
    assert jsonio.loads('{"a": 1, "a": NaN}', "f", strict=False)["a"] != 0  # NaN, last wins
    with pytest.raises(jsonio.JSONInputError, match="nested deeper"):
        jsonio.loads("[" * 10_000 + "]" * 10_000, "f", strict=False)


def test_non_utf8_bytes_are_named():
    with pytest.raises(
        jsonio.JSONInputError, match=r"m: line 2: not UTF-8 \(byte 0xe9 at column 4\)"
    ):
        jsonio.load_bytes(b'{"a":\n"ca\xe9"}', "m")
    assert jsonio.load_bytes('{"a": "café"}'.encode(), "m") == {"a": "café"}
