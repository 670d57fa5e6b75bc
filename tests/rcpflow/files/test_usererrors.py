"""`refused_as`: a lower module's refusal handed on as the caller's own error."""

from __future__ import annotations

import pytest

from rcpflow.files.usererrors import refused_as


class LowerError(ValueError):
    pass


class CallerError(ValueError):
    pass


def _read(fail: BaseException | None) -> str:
    with refused_as(CallerError, LowerError, KeyError):
        if fail is not None:
            raise fail
        return "read"


def test_a_listed_error_is_raised_again_as_the_callers_with_its_message_and_cause() -> None:
    lower = LowerError("manifest.jsonl line 3: step 0 must be >= 1")
    with pytest.raises(CallerError) as e:
        _read(lower)
    assert str(e.value) == "manifest.jsonl line 3: step 0 must be >= 1"
    assert e.value.__cause__ is lower


def test_every_listed_kind_is_handed_on() -> None:
    with pytest.raises(CallerError):
        _read(KeyError("step"))


def test_other_errors_pass_unchanged_and_a_clean_block_returns() -> None:
    bug = RuntimeError("a bug keeps its own type")
    with pytest.raises(RuntimeError) as e:
        _read(bug)
    assert e.value is bug
    assert _read(None) == "read"
