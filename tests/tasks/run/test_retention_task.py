"""The run DAG's retention task (`tasks.run.retention`) and its ``[retention]`` settings: off by
default, the Param refused in one named line, the rule applied to the decided run, a foreign
trainer's tree only where the deployment allows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.synthetic_run import make_run, write_eval
from rcpflow.retention.apply import read_record
from rcpflow.retention.lock import holding
from tasks.deployment import DeploymentError, RetentionSettings, parse_deployment
from tasks.jobs.templates import TrainResult
from tasks.run import retention
from tasks.run.retention import (
    RetentionTaskError,
    apply_retention,
    retain_after_evaluation,
    retention_choice,
    retention_params,
)
from tasks.run.spec import ParamError

OWN = TrainResult()


def _deployment(text: str):
    return parse_deployment(text, source="d.toml", base_dir=Path("."))


def _run(tmp_path: Path, tree: Path | None = None):
    """Decided at step 20 (18, 19 below); 21 and 22 saved but not evaluated; the checkpoints
    under `tree` (the rows name them there, as a NeMo-RL import writes them), else the run's."""
    run = make_run(str(tmp_path / "run"), max_steps=22)
    if tree is not None:
        rows = Path(run.layout.manifest).read_text()
        Path(run.layout.manifest).write_text(rows.replace("../checkpoints/", f"{tree}/"))
    for step in range(18, 23):
        folder = Path(run.layout.checkpoint(step)) if tree is None else tree / str(step)
        folder.mkdir(parents=True)
        (folder / "weights").write_bytes(b"w" * 10)
    for step, accuracy in ((18, 0.5), (19, 0.5), (20, 0.8)):
        write_eval(run, step, accuracy)
    return run


def test_retention_is_off_by_default_and_its_settings_are_bounded() -> None:
    assert _deployment("").retention == RetentionSettings(keep="off")
    assert retention_params(_deployment(""))["retention"].value == "off"
    on = _deployment('[retention]\nkeep = "last-k"\nlast_k = 2\nforeign_trees = true\n')
    assert on.retention == RetentionSettings("last-k", 2, foreign_trees=True)
    assert retention_params(on)["retention"].value == "last-k"
    for bad, said in (
        ('keep = "all"', "retention.keep: must be one of 'off', 'passing'"),
        ("last_k = 1001", "retention.last_k: must be in 0..1000, got 1001"),
        ("settled = 1", "retention.settled: must be bool"),
    ):
        with pytest.raises(DeploymentError, match=said):
            _deployment(f"[retention]\n{bad}\n")


def test_the_param_is_refused_naming_it() -> None:
    assert retention_choice("nothing") == "nothing"
    for bad in ("all", 3, None):
        with pytest.raises(ParamError, match=r"^retention: .* is not one of off, passing, last-k"):
            retention_choice(bad)


def test_off_deletes_nothing_and_passing_deletes_what_the_decided_run_needs_no_more(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path)
    settings = RetentionSettings(keep="passing")
    assert apply_retention(run.run_dir, 1, "off", settings, OWN, settled=True) is None
    assert read_record(run.run_dir) is None
    done = apply_retention(run.run_dir, 1, "passing", settings, OWN, settled=True)
    assert done is not None
    assert done["deleted"] == ["step 18", "step 19", "step 21", "step 22"]
    assert done["kept"] == ["step 20"] and done["bytes_deleted"] == 40
    assert sorted(p.name for p in Path(run.layout.checkpoints_dir).iterdir()) == ["20"]


def test_unsettled_keeps_the_unevaluated_above_the_passing_step(tmp_path: Path) -> None:
    run = _run(tmp_path)
    unsettled = RetentionSettings(keep="passing", settled=False)
    done = apply_retention(run.run_dir, 1, "passing", unsettled, OWN, settled=True)
    assert done is not None and done["deleted"] == ["step 18", "step 19"]


def test_a_foreign_tree_is_deleted_from_only_where_the_deployment_allows(tmp_path: Path) -> None:
    foreign = tmp_path / "nemo" / "checkpoints"
    run = _run(tmp_path, foreign)
    result = TrainResult(format="nemo-rl-checkpoints", path=str(foreign))
    closed = RetentionSettings(keep="passing")
    done = apply_retention(run.run_dir, 1, "passing", closed, result, settled=True)
    assert done is not None and done["deleted"] == []
    allowed = RetentionSettings(keep="passing", foreign_trees=True)
    done = apply_retention(run.run_dir, 1, "passing", allowed, result, settled=True)
    assert done is not None and done["deleted"] == ["step 18", "step 19", "step 21", "step 22"]
    assert sorted(p.name for p in foreign.iterdir()) == ["20"]


def test_the_task_fails_naming_an_apply_that_holds_the_run_folder(tmp_path: Path) -> None:
    run = _run(tmp_path)
    settings = RetentionSettings(keep="passing")
    busy = pytest.raises(RetentionTaskError, match="another retention apply holds the run")
    with holding(run.run_dir), busy:  # a person's `rcpflow retention apply`, held mid-way
        apply_retention(run.run_dir, 1, "passing", settings, OWN, settled=True)
    assert read_record(run.run_dir) is None  # the refused task changed nothing
    assert all(Path(run.layout.checkpoint(s)).is_dir() for s in range(18, 23))
    done = apply_retention(run.run_dir, 1, "passing", settings, OWN, settled=True)
    assert done is not None and done["kept"] == ["step 20"]


def _left(run) -> list[str]:
    return sorted(p.name for p in Path(run.layout.checkpoints_dir).iterdir())


def test_after_an_evaluation_the_evaluated_below_the_target_go_and_nothing_else(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path)
    off = RetentionSettings(keep="passing")  # while_training off: the final task alone
    assert retain_after_evaluation(run.run_dir, 1, 19, "passing", off, OWN) is None
    assert read_record(run.run_dir) is None
    during = RetentionSettings(keep="passing", while_training=True)
    assert retain_after_evaluation(run.run_dir, 1, 19, "off", during, OWN) is None
    done = retain_after_evaluation(run.run_dir, 1, 19, "passing", during, OWN)
    # never settled: 21 and 22 (not evaluated) stay, whatever the deployment's `settled`
    assert done is not None and done["deleted"] == ["step 18", "step 19"]
    assert _left(run) == ["20", "21", "22"]


def test_after_an_evaluation_nothing_it_meets_fails_the_evaluation(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    run = _run(tmp_path)
    during = RetentionSettings(keep="passing", while_training=True)
    assert retain_after_evaluation(run.run_dir, 1, 19, "all", during, OWN) is None
    assert "retention after step 19: retention: 'all' is not one of" in caplog.text
    monkeypatch.setattr(retention, "LOCK_PATIENCE_S", 0.2)
    with holding(run.run_dir):  # a person's apply, for longer than the patience
        assert retain_after_evaluation(run.run_dir, 1, 19, "passing", during, OWN) is None
    assert "another retention apply holds the run folder" in caplog.text

    def unreadable(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", run.layout.checkpoints_dir)

    monkeypatch.setattr(retention, "apply_run", unreadable)
    assert retain_after_evaluation(run.run_dir, 1, 19, "passing", during, OWN) is None
    assert "Permission denied" in caplog.text
    assert read_record(run.run_dir) is None and len(_left(run)) == 5
