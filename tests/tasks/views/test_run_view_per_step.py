"""The RCP view's run page degrades per step (issue 29): one step's attempts path that is a
folder is that step's unreadable summary, the other steps and the verdict preview still shown."""

from __future__ import annotations

from pathlib import Path

from devtools.synthetic_run import passing_run
from rcpflow.verdict.verify import attempts_file
from tasks.views.storage_index import read_run


def test_an_attempts_folder_is_one_unreadable_step_on_the_run_page(tmp_path: Path) -> None:
    run = passing_run(tmp_path)
    Path(attempts_file(run.run_dir, 19)).mkdir(parents=True)
    view = read_run(run.run_dir, "run")
    assert view.status.manifest_error is None
    by_step = {s.step: s for s in view.status.steps}
    assert by_step[18].summary == "valid" and by_step[19].summary == "unreadable"
    assert "Is a directory" in by_step[19].problems[0]
