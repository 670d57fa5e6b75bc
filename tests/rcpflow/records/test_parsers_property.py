"""Property-based (issue 29): every parser of outside input among the records (manifest rows,
summaries, attempt records) either accepts a text, and what it accepted reads back as the same
thing, or refuses it in one line naming where (its own ValueError), never a traceback."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from outside_input import accepted_or_one_line

from devtools.synthetic_run import attempts_for_accuracy
from rcpflow import recipe
from rcpflow.records.attempts import AttemptsError, parse_attempts
from rcpflow.records.manifest import ManifestError, ManifestRow, parse_rows, render_rows
from rcpflow.records.summary import EvalSummary, SummaryError, build_summary

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)

ROW = ManifestRow(
    step=18, checkpoint_path="../checkpoints/18", timestamp_ms=1_700_000_100_000,
    samples_count=18 * 256, global_batch_size=256, batch_size=16, num_generations=16,
    val_start_at=18, max_steps=60, target_accuracy=recipe.TARGET_ACCURACY, seed=1,
    mllog_file="seed_1.out",
)  # fmt: skip
SUMMARY = build_summary(
    attempts_for_accuracy(0.5),
    checkpoint=ROW,
    target_accuracy=ROW.target_accuracy,
    eval_start_ms=1_700_000_200_000,
    eval_stop_ms=1_700_000_300_000,
)


def mutated(base: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    d = dict(base)
    for _ in range(data.draw(st.integers(0, 3))):
        key = data.draw(st.sampled_from([*sorted(base), "extra"]))
        if data.draw(st.booleans()) and key in d:
            del d[key]
        else:
            d[key] = data.draw(JSON)
    return d


def rows_read_back_or_one_line(text: str) -> None:
    rows = accepted_or_one_line(ManifestError, "m.jsonl", parse_rows, text, "m.jsonl")
    if rows is not None:
        assert parse_rows(render_rows(rows).decode(), "again") == rows


@SETTINGS
@given(st.data())
def test_a_manifest_row_is_accepted_and_reads_back_or_refused_in_one_line(data):
    d = mutated(json.loads(ROW.to_json()), data)
    text = data.draw(st.sampled_from([json.dumps(d), json.dumps(d)[:-1], json.dumps([d])]))
    rows_read_back_or_one_line(text)


@SETTINGS
@given(st.text(max_size=200))
def test_any_text_is_rows_or_one_named_line(text):
    rows_read_back_or_one_line(text)


@SETTINGS
@given(st.data())
def test_a_summary_is_accepted_and_reads_back_or_refused_in_one_line(data):
    d = mutated(json.loads(SUMMARY.to_json()), data)
    summary = accepted_or_one_line(
        SummaryError, "s.json", EvalSummary.from_json, json.dumps(d), "s.json"
    )
    if summary is None:
        return
    assert EvalSummary.from_json(summary.to_json(), "again") == summary
    assert dataclasses.asdict(summary)  # a plain dataclass of JSON values


RECORDS = [
    {"instance": 0, "attempt": 0, "status": "resolved", "reward": 1.0},
    {"docker_image": "img", "exit_reason": "done", "reward": 0.0},
]


@SETTINGS
@given(st.data())
def test_attempt_records_are_counted_or_refused_in_one_line(data):
    lines = [
        json.dumps(mutated(data.draw(st.sampled_from(RECORDS)), data))
        for _ in range(data.draw(st.integers(1, 4)))
    ]
    text = "\n".join(lines) + data.draw(st.sampled_from(["", "\n", "\n{", "\n[]"]))
    found = accepted_or_one_line(AttemptsError, "a.jsonl", parse_attempts, text, "a.jsonl")
    if found is None:
        return
    assert parse_attempts(text, "again") == found  # the same reading every time
    assert sum(len(t.attempts) for t in found.tasks) + found.not_counted <= len(lines)
