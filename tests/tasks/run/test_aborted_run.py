"""An aborted run (every checkpoint up to max_steps evaluated, none above the target) says so
in plain words in the finalize and check task logs, ahead of the compliance checker's own."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from devtools.synthetic_run import make_run
from tasks.jobs.result import EvaluationError
from tasks.run.stages import check_run, finalize_run

SENTENCE = "aborted: no checkpoint reached the target by step 24"


@pytest.mark.timeout(300)
def test_an_aborted_run_says_so_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = make_run(
        str(tmp_path / "run"), max_steps=24, accuracies=dict.fromkeys(range(18, 25), 0.5)
    )
    with caplog.at_level(logging.INFO, logger="tasks.run.stages"):
        result = finalize_run(run.run_dir)
    assert result["status"] == "aborted" and result["step"] == 24
    assert SENTENCE in caplog.messages
    caplog.clear()
    with (
        caplog.at_level(logging.INFO, logger="tasks.run.stages"),
        pytest.raises(EvaluationError) as refused,
    ):
        check_run(run.run_dir)
    assert str(refused.value).startswith(SENTENCE + "; compliance checker")
    assert caplog.messages[0] == SENTENCE  # before the checker's output
