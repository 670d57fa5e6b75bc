"""A trainer's own step folder with rcpflow's record in its metadata (`native_checkpoints`): read
only once committed, every malformed part refused by name, the record round-tripped."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tpu_jobs.rcp.checkpoint_format import COMMIT_MARKER, CheckpointError
from tpu_jobs.rcp.native_checkpoints import (
    RCPFLOW_KEY,
    STEP_METADATA,
    StepRecord,
    read_custom_metadata,
    wait_for_commit,
)


@dataclass(frozen=True)
class SizedRecord(StepRecord):
    size: Mapping[str, int]

    @classmethod
    def own_fields(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {"size": dict(d["size"])}


RECORD = SizedRecord(
    step=3, timestamp_ms=1000, weights_fingerprint="abc", run={"seed": 1}, size={"layers": 2}
)


def step_folder(tmp_path: Path, metadata: object, committed: bool = True) -> str:
    folder = tmp_path / "3"
    folder.mkdir()
    (folder / STEP_METADATA).write_text(json.dumps(metadata))
    if committed:
        (folder / COMMIT_MARKER).write_text("")
    return str(folder)


def test_a_committed_record_round_trips(tmp_path: Path) -> None:
    folder = step_folder(tmp_path, {"custom_metadata": {RCPFLOW_KEY: RECORD.to_json()}})
    custom = read_custom_metadata(folder)
    assert SizedRecord.in_metadata(custom, where=folder) == RECORD


@pytest.mark.parametrize(
    ("metadata", "committed", "match"),
    [
        ({"custom_metadata": {}}, False, "not a complete Tunix checkpoint"),
        ({"other": 1}, True, "unreadable step metadata"),
        ({"custom_metadata": [1]}, True, "custom_metadata is not an object"),
    ],
)
def test_a_step_folder_that_cannot_be_read_is_refused(
    tmp_path: Path, metadata: object, committed: bool, match: str
) -> None:
    folder = step_folder(tmp_path, metadata, committed)
    with pytest.raises(CheckpointError, match=match):
        read_custom_metadata(folder, "Tunix checkpoint")


@pytest.mark.parametrize(
    ("custom", "match"),
    [
        ({}, "has no 'rcpflow' record"),
        ({RCPFLOW_KEY: {**RECORD.to_json(), "format": 2}}, "no rcpflow record of format 1"),
        ({RCPFLOW_KEY: {**RECORD.to_json(), "step": "x"}}, "malformed rcpflow record"),
        ({RCPFLOW_KEY: {k: v for k, v in RECORD.to_json().items() if k != "size"}}, "malformed"),
    ],
)
def test_a_missing_or_malformed_record_is_refused(custom: dict, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        SizedRecord.in_metadata(custom, where="meta")


def test_a_step_that_never_commits_times_out_by_name(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"step 3: .* did not commit within 0 s"):
        wait_for_commit(str(tmp_path / "3"), 3, timeout_s=0.05)
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / COMMIT_MARKER).write_text("")
    wait_for_commit(str(tmp_path / "3"), 3, timeout_s=0.05)
