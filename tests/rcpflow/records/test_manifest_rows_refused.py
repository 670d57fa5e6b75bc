"""Manifest rows that cannot be this run's: an `mllog_file` that is not the run's own log, and
counts or steps that are zero or negative."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from file_tree import tree_bytes
from rcpflow_cli import assert_one_invalid_line, run_cli

from devtools.synthetic_run import passing_run
from rcpflow.records.manifest import ManifestError, load
from rcpflow.verdict.finalize import finalize


def test_mllog_file_outside_the_run_is_invalid(tmp_path):
    run = passing_run(tmp_path)
    other = passing_run(tmp_path, "other", seed=5)
    manifest = Path(run.layout.manifest)
    manifest.write_text(
        manifest.read_text().replace('"seed_1.out"', '"../../other/mllog/seed_5.out"')
    )
    before = tree_bytes(tmp_path)
    for args in (("finalize", run.run_dir), ("manifest", "validate", str(manifest))):
        assert_one_invalid_line(run_cli(*args), "step 18: mllog_file", "not this run's MLLOG")
    assert tree_bytes(tmp_path) == before  # neither this run's log nor the other's touched
    assert finalize(other.run_dir).status == "success"  # the other run is fine on its own


def test_own_log_by_absolute_path_is_accepted(tmp_path):
    run = passing_run(tmp_path)
    manifest = Path(run.layout.manifest)
    manifest.write_text(
        manifest.read_text().replace(
            '"seed_1.out"', json.dumps(str(tmp_path / "run/mllog/seed_1.out"))
        )
    )
    assert load(str(manifest)).rows[0].mllog_file.endswith("seed_1.out")
    assert finalize(run.run_dir).status == "success"


@pytest.mark.parametrize(
    "field",
    ["step", "val_start_at", "global_batch_size", "max_steps", "batch_size", "num_generations",
     "timestamp_ms", "samples_count"],
)  # fmt: skip
@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_numbers_are_invalid(tmp_path, field, value):
    run = passing_run(tmp_path, max_steps=18, accuracies={})
    row = dataclasses.replace(run.row(18), **{field: value})
    Path(run.layout.manifest).write_text(row.to_json() + "\n")
    with pytest.raises(ManifestError, match=f"line 1: {field} must be positive, got {value}"):
        load(run.layout.manifest)


def test_negative_step_and_val_start_via_cli(tmp_path):
    run = passing_run(tmp_path, max_steps=18, accuracies={})
    row = dataclasses.replace(run.row(18), step=-1, val_start_at=-1, samples_count=-256)
    Path(run.layout.manifest).write_text(row.to_json() + "\n")
    assert_one_invalid_line(
        run_cli("manifest", "validate", run.layout.manifest), "must be positive"
    )
