"""rcpflow.submission.checkers runs the real mlperf_logging tools on logs that rcpflow itself wrote
(TrainingLog + manifest + summaries via tests/synthetic_run.py, then finalize)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from devtools.synthetic_run import make_run
from rcpflow.files.layout import RunLayout
from rcpflow.submission import checkers
from rcpflow.verdict.finalize import finalize

# Each checker subprocess takes ~1-2 s here; a hang must fail the test, not CI.
pytestmark = pytest.mark.timeout(180)

CONVERGES_AT = {1: 19, 2: 18, 3: 20}  # seed -> first step with pass@4 > 0.69 (gbs 256: start 18)
NEVER = {step: 0.68 for step in range(18, 25)}  # every step up to max_steps 24, never > 0.69


def accuracies_converging_at(step: int) -> dict[int, float]:
    return {s: (0.75 if s == step else 0.5) for s in range(18, step + 1)}


def finalized_log(
    root: str, seed: int, accuracies: Mapping[int, float], division: str = "closed"
) -> str:
    run = make_run(
        os.path.join(root, f"run_{seed}"), seed=seed, accuracies=accuracies, division=division
    )
    finalize(run.run_dir)
    return RunLayout(run.run_dir).mllog(seed)


def results_folder(tmp_path: Path, logs: list[str]) -> str:
    folder = tmp_path / "results"
    folder.mkdir()
    for i, log in enumerate(logs):
        shutil.copyfile(log, folder / f"result_{i}.txt")
    return str(folder)


def test_a_converged_closed_log_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = finalized_log(str(tmp_path), 1, accuracies_converging_at(19))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    result = checkers.compliance(log, "closed", log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output
    assert (result.returncode, result.errors) == (0, ())
    assert result.command[1:5] == ("-m", "mlperf_logging.compliance_checker", "--usage", "training")
    assert "6.1.0" in result.command
    assert "closed_qwen35_397b_grpo.yaml" in result.output  # the closed GRPO rules really ran
    assert "SUCCESS" in Path(result.log_file).read_text()
    assert Path(result.log_file).parent == tmp_path / "checks"
    assert list(cwd.iterdir()) == []  # the tool's own log files did not land in our cwd


def test_a_log_that_never_exceeds_the_target_fails(tmp_path: Path) -> None:
    log = finalized_log(str(tmp_path), 1, NEVER)  # finalize: aborted at max_steps
    result = checkers.compliance(log, "closed", log_dir=str(tmp_path / "checks"))
    assert not result.ok
    assert result.returncode == 1
    assert result.errors == ("Failed checks for eval_accuracy : v['value'] > s['target_accuracy']",)


def test_an_unfinished_log_fails_for_its_missing_run_stop(tmp_path: Path) -> None:
    # Steps 18 and 19 evaluated (0.5), 20..24 never: finalize writes no run_stop.
    log = finalized_log(str(tmp_path), 1, {18: 0.5, 19: 0.5})
    result = checkers.compliance(log, log_dir=str(tmp_path / "checks"))
    assert not result.ok
    assert any("'run_stop' but found 0" in e for e in result.errors), result.errors


def test_an_open_division_log_is_checked_by_the_open_rules(tmp_path: Path) -> None:
    log = finalized_log(str(tmp_path), 5, accuracies_converging_at(19), division="open")
    result = checkers.compliance(log, "open", log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output
    assert "open_qwen35_397b_grpo.yaml" in result.output
    # Asking for the closed rules on an open log is refused, though the tool itself passes it.
    wrong = checkers.compliance(log, "closed", log_dir=str(tmp_path / "checks"))
    assert wrong.returncode == 0 and not wrong.ok
    assert wrong.errors == (
        f"{log}: submission_division is 'open', but the 'closed' rules were asked for",
    )


def test_a_broken_log_names_its_lines(tmp_path: Path) -> None:
    good = finalized_log(str(tmp_path), 1, accuracies_converging_at(18))
    lines = Path(good).read_text().splitlines(keepends=True)
    broken = tmp_path / "broken.out"
    broken.write_text(
        "".join(
            line.replace('"value": 1e-06', '"value": 2e-06')
            for line in lines
            if '"micro_batch_size"' not in line
        )
        + ":::MLLOG {not json\n"
    )
    result = checkers.compliance(str(broken), log_dir=str(tmp_path / "checks"))
    assert not result.ok
    joined = "\n".join(result.errors)
    assert "unparsable log line ':::MLLOG {not json'" in joined
    assert "Required EXACTLY_ONE occurrence of 'micro_batch_size' but found 0" in joined
    assert "CHECK for 'opt_base_learning_rate' failed" in joined
    assert "abs(v['value'] - s['learning_rate']) < 1e-9" in joined


def test_unknown_division_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="division"):
        checkers.compliance(str(tmp_path / "x.out"), "closd")


def test_missing_log_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.out"):
        checkers.compliance(str(tmp_path / "nope.out"), log_dir=str(tmp_path))


@pytest.mark.gcs
def test_a_log_on_gcs_is_checked(gcs_prefix: str, tmp_path: Path) -> None:
    log = finalized_log(gcs_prefix, 2, accuracies_converging_at(18))
    assert log.startswith("gs://")
    result = checkers.compliance(log, log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output
    assert result.command[-1].startswith(str(tmp_path / "checks" / "input"))


def test_rcp_passes_three_converged_runs(tmp_path: Path) -> None:
    logs = [finalized_log(str(tmp_path), s, accuracies_converging_at(st)) for s, st in
            CONVERGES_AT.items()]  # fmt: skip
    result = checkers.rcp(results_folder(tmp_path, logs), log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output
    assert result.command[3:7] == ("--rcp_usage", "training", "--rcp_version", "6.1.0")
    # olympic mean of 18, 19, 20 steps x 256 samples
    assert "Submission mean epochs: 4864.0000" in result.output


def test_rcp_fails_when_two_of_three_runs_did_not_converge(tmp_path: Path) -> None:
    logs = [
        finalized_log(str(tmp_path), 1, accuracies_converging_at(18)),
        finalized_log(str(tmp_path), 2, NEVER),
        finalized_log(str(tmp_path), 3, NEVER),
    ]
    result = checkers.rcp(results_folder(tmp_path, logs), log_dir=str(tmp_path / "checks"))
    assert not result.ok
    assert result.returncode == 1
    assert any("Insufficient convergence" in e for e in result.errors), result.errors


def test_rcp_tolerates_one_non_converged_run_of_three(tmp_path: Path) -> None:
    logs = [
        finalized_log(str(tmp_path), 1, accuracies_converging_at(18)),
        finalized_log(str(tmp_path), 2, accuracies_converging_at(19)),
        finalized_log(str(tmp_path), 3, NEVER),
    ]
    result = checkers.rcp(results_folder(tmp_path, logs), log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output
