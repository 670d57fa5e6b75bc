"""Where the files of a run live (rcpflow.files.layout.RunLayout): the names are a contract
with trainers, older releases and other tools, so each is pinned here, locally and on gs://."""

from __future__ import annotations

import pytest

from rcpflow.files.layout import RunLayout, check_verdict, check_verdict_name, mllog_name

PLACED = [
    (lambda r: r.mllog_dir, "mllog"),
    (lambda r: r.manifest, "mllog/eval_checkpoints.jsonl"),
    (lambda r: r.mllog(3), "mllog/seed_3.out"),
    (lambda r: r.checkpoints_dir, "checkpoints"),
    (lambda r: r.checkpoint(40), "checkpoints/40"),
    (lambda r: r.eval_root, "eval"),
    (lambda r: r.eval_dir(40), "eval/step_40"),
    (lambda r: r.summary(40), "eval/step_40/summary.json"),
    (lambda r: r.attempts_dir(40), "eval/step_40/attempts"),
    (lambda r: r.stop_request, "stop_request.json"),
    (lambda r: r.owner, "owner.json"),
    (lambda r: r.eval_schedule, "eval_schedule.json"),
    (lambda r: r.checks_dir, "checks"),
    (lambda r: r.check("compliance_checker"), "checks/compliance_checker.json"),
]


@pytest.mark.parametrize("root", ["/runs/seed_1", "gs://bucket/runs/seed_1"])
@pytest.mark.parametrize(("place", "relative"), PLACED)
def test_every_file_of_a_run_folder_has_one_place(root, place, relative) -> None:
    assert place(RunLayout(root)) == f"{root}/{relative}"


def test_a_submission_folder_keeps_its_verdicts_as_a_run_does() -> None:
    assert (
        check_verdict("gs://b/sub", "package_checker") == "gs://b/sub/checks/package_checker.json"
    )
    assert check_verdict_name("package_checker") == "checks/package_checker.json"
    assert mllog_name(7) == "seed_7.out"
