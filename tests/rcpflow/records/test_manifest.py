"""Manifest rows: upsert, and validation that names the step or line."""

import dataclasses
import json
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.synthetic_run import make_run, rows_of
from rcpflow.records.manifest import ManifestError, ManifestRow, load, parse_rows, upsert


def test_valid_manifest_resolves_paths(tmp_path):
    run = make_run(str(tmp_path), max_steps=22)
    m = load(run.layout.manifest)
    assert [r.step for r in m.rows] == [18, 19, 20, 21, 22]
    assert m.rows[0].checkpoint_path == str(tmp_path / "checkpoints" / "18")
    assert m.rows[0].mllog_file == str(tmp_path / "mllog" / "seed_1.out")
    assert m.stale_steps == ()


def test_upsert_replaces_and_keeps_sorted(tmp_path):
    run = make_run(str(tmp_path), max_steps=20)
    upsert(run.layout.manifest, dataclasses.replace(run.row(19), weights_fingerprint="abc"))
    rows = parse_rows(Path(run.layout.manifest).read_text(), "m")
    assert [r.step for r in rows] == [18, 19, 20]
    assert rows[1].weights_fingerprint == "abc"


def test_concurrent_upserts_lose_nothing(tmp_path):
    run = make_run(str(tmp_path), max_steps=17 + 40, last_step=17)  # no rows yet
    steps = list(range(18, 58))
    threads = [
        threading.Thread(target=upsert, args=(run.layout.manifest, run.row(s))) for s in steps
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.step for r in rows_of(run.run_dir)] == steps


def _rewrite(path, rows):
    with open(path, "w") as f:
        f.writelines(r.to_json() + "\n" for r in rows)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda rows: rows[:2] + rows[3:], "steps 20 missing between 19 and 21"),
        (lambda rows: rows[1:], "step 19: first checkpoint must be the validation start step 18"),
        (
            lambda rows: [*rows[:1], dataclasses.replace(rows[1], seed=7), *rows[2:]],
            "step 19: seed 7 differs",
        ),
        (
            lambda rows: (
                [
                    *rows[:3],
                    dataclasses.replace(rows[3], global_batch_size=512, samples_count=21 * 512),
                ]
            ),
            "step 21: global_batch_size 512 differs",
        ),
        (
            lambda rows: [dataclasses.replace(rows[0], samples_count=1), *rows[1:]],
            "step 18: samples_count 1 != step",
        ),
        (
            lambda rows: [*rows[:1], dataclasses.replace(rows[1], target_accuracy=0.5), *rows[2:]],
            "line 2: target_accuracy 0.5 is not the benchmark's 0.69",
        ),
        (lambda rows: [*rows, rows[-1]], "step 21: appears more than once"),
        (
            lambda rows: (
                [
                    *rows[:1],
                    dataclasses.replace(rows[1], timestamp_ms=rows[0].timestamp_ms),
                    *rows[2:],
                ]
            ),
            "step 19: timestamp_ms",
        ),
        (
            lambda rows: (
                [*rows[:1], dataclasses.replace(rows[1], mllog_file="other.out"), *rows[2:]]
            ),
            "step 19: mllog_file",
        ),
    ],
)
def test_invalid_rows_are_named(tmp_path, mutate, message):
    run = make_run(str(tmp_path), max_steps=21)
    rows = [run.row(s) for s in range(18, 22)]
    _rewrite(run.layout.manifest, mutate(rows))
    with pytest.raises(ManifestError, match=message):
        load(run.layout.manifest)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: a row must be a JSON object"),
        ('{"step": 19}', "line 2: missing field"),
    ],
)
def test_malformed_lines_are_named(tmp_path, line, message):
    run = make_run(str(tmp_path), max_steps=19)
    with open(run.layout.manifest) as f:
        first = f.readline()
    with open(run.layout.manifest, "w") as f:
        f.write(first + line + "\n")
    with pytest.raises(ManifestError, match=message):
        load(run.layout.manifest)


def test_wrong_types_and_unknown_fields(tmp_path):
    run = make_run(str(tmp_path), max_steps=18)
    d = json.loads(run.row(18).to_json())
    for bad, message in (
        (dict(d, step="18"), "step must be an integer"),
        (dict(d, extra=1), "unknown field"),
        (dict(d, target_accuracy=True), "target_accuracy"),
    ):
        with open(run.layout.manifest, "w") as f:
            f.write(json.dumps(bad) + "\n")
        with pytest.raises(ManifestError, match=f"line 1: .*{message}"):
            load(run.layout.manifest)


def test_stale_rows_dropped_with_warning(tmp_path):
    # Steps 21-22 were written by an earlier attempt (before this run_start): dropped.
    run = make_run(str(tmp_path), max_steps=22, last_step=20, stale_steps=(21, 22))
    m = load(run.layout.manifest)
    assert [r.step for r in m.rows] == [18, 19, 20]
    assert m.stale_steps == (21, 22)
    assert any("step 21" in w and "older than run_start" in w for w in m.warnings)


def test_stale_first_row_makes_a_late_start(tmp_path):
    run = make_run(str(tmp_path), max_steps=20, last_step=17, stale_steps=(18,))
    for s in (19, 20):
        upsert(run.layout.manifest, run.row(s))
    with pytest.raises(ManifestError, match="step 19: first checkpoint"):
        load(run.layout.manifest)


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="no manifest"):
        load(str(tmp_path / "nope.jsonl"))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sets(st.integers(18, 40), min_size=1, max_size=23))
def test_property_valid_iff_contiguous_from_start(tmp_path_factory, steps):
    run = make_run(str(tmp_path_factory.mktemp("run")), max_steps=40, last_step=17)
    _rewrite(run.layout.manifest, [run.row(s) for s in sorted(steps, reverse=True)])
    contiguous = min(steps) == 18 and max(steps) - min(steps) + 1 == len(steps)
    if contiguous:
        assert [r.step for r in rows_of(run.run_dir)] == sorted(steps)
    else:
        with pytest.raises(ManifestError, match=r"steps? \d+"):
            load(run.layout.manifest)


def test_row_from_dict_round_trip(tmp_path):
    row = dataclasses.replace(make_run(str(tmp_path)).row(19), weights_fingerprint="sha256:ab")
    assert ManifestRow.from_dict(json.loads(row.to_json()), where="x") == row
