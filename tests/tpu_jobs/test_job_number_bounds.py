"""The jobs' numbers are bounded (issue 29): the rehearsal jobs' --time-scale and the local
launcher's --grace-s are refused in one usage line naming the flag, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_jobs import launch
from tpu_jobs.rehearsal import evaluate, train


@pytest.mark.parametrize("scale", ["1e308", "inf", "nan", "-1", "101"])
def test_a_time_scale_out_of_range_is_a_usage_error_before_any_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scale: str
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as done:
        train.parse_args(["--run-dir", str(run_dir), "--seed", "1", "--time-scale", scale])
    assert done.value.code == 2
    assert "--time-scale" in capsys.readouterr().err.splitlines()[-1]
    with pytest.raises(SystemExit) as done:
        evaluate.parse_args(["--run-dir", str(run_dir), "--step", "18", "--time-scale", scale])
    assert done.value.code == 2
    assert "--time-scale" in capsys.readouterr().err.splitlines()[-1]
    assert not run_dir.exists()


@pytest.mark.parametrize("grace", ["nan", "inf", "-1", "1e308"])
def test_a_grace_period_out_of_range_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], grace: str
) -> None:
    with pytest.raises(SystemExit) as done:
        launch.main(["--processes", "2", "--grace-s", grace, "--", "true"])
    assert done.value.code == 2
    assert "--grace-s" in capsys.readouterr().err.splitlines()[-1]
