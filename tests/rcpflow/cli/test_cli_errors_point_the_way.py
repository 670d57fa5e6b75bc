"""Every `rcpflow` command tells a problem in one style (``invalid:`` bad input, ``error:`` a
failure, ``usage error:`` flags), and a path of the wrong kind says what it is and what to give
instead: a submission folder, a file, a missing folder. `status` shows times in UTC."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rcpflow_cli import run_cli

from devtools.synthetic_run import SyntheticRun, make_run
from rcpflow.cli.commands import main
from rcpflow.cli.status import utc_text


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[int, SyntheticRun]:
    """``runs/demo``, a submission of three runs, with the current directory above it."""
    monkeypatch.chdir(tmp_path)
    return {s: make_run(str(tmp_path / "runs/demo/runs" / f"seed_{s}"), seed=s) for s in (1, 2, 3)}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line(capsys: pytest.CaptureFixture[str], code: int, expected_code: int = 1) -> str:
    out, err = capsys.readouterr()
    assert code == expected_code and out == "", (out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_status_of_a_submission_folder_names_its_runs(demo, capsys) -> None:
    line = _one_line(capsys, main(["status", "runs/demo"]))
    assert line == (
        "invalid: runs/demo: is a submission folder, not a run folder; did you mean "
        "runs/demo/runs/seed_1 (or seed_2, seed_3)?"
    )
    p = run_cli("status", "runs/demo")  # the example, from the real entry point
    assert p.returncode == 1 and p.stdout == "" and p.stderr == line + "\n"


# A path of the wrong kind: (argv, the one line that says what it is and what to give instead).
WRONG_KIND_OF_PATH = {
    "a folder of runs names them": (
        ["status", "runs/demo/runs"],
        "invalid: runs/demo/runs: is a folder of runs, not a run folder; did you mean "
        "runs/demo/runs/seed_1 (or seed_2, seed_3)?",
    ),
    "a file names the run folder it is in": (
        ["status", "runs/demo/runs/seed_1/mllog/seed_1.out"],
        "invalid: runs/demo/runs/seed_1/mllog/seed_1.out: is a file, not a run folder; did you "
        "mean runs/demo/runs/seed_1 (the run folder it is in)?",
    ),
    "a folder inside a run names the run": (
        ["status", "runs/demo/runs/seed_2/mllog"],
        "invalid: runs/demo/runs/seed_2/mllog: is a folder inside a run, not a run folder; "
        "did you mean runs/demo/runs/seed_2?",
    ),
    "a missing folder names the runs beside it": (
        ["status", "runs/demo/runs/seed_4"],
        "invalid: runs/demo/runs/seed_4: does not exist; did you mean runs/demo/runs/seed_1 "
        "(or seed_2, seed_3)?",
    ),
    "a missing folder elsewhere says what to give": (
        ["status", "/nowhere/run"],
        "invalid: /nowhere/run: does not exist; give a run folder (a run folder holds mllog/)",
    ),
    "a run folder for a manifest names the manifest": (
        ["manifest", "validate", "runs/demo/runs/seed_3"],
        "invalid: runs/demo/runs/seed_3: is a run folder, not a manifest "
        "(RUN_DIR/mllog/eval_checkpoints.jsonl); did you mean "
        "runs/demo/runs/seed_3/mllog/eval_checkpoints.jsonl?",
    ),
    "an mllog folder for an MLLOG names the MLLOG": (
        ["check", "runs/demo/runs/seed_3/mllog"],
        "invalid: runs/demo/runs/seed_3/mllog: is a run's mllog folder, not an MLLOG "
        "(RUN_DIR/mllog/seed_<n>.out); did you mean runs/demo/runs/seed_3/mllog/seed_3.out?",
    ),
}


@pytest.mark.parametrize("case", WRONG_KIND_OF_PATH)
def test_a_path_of_the_wrong_kind_says_what_it_is_and_what_to_give(demo, capsys, case) -> None:
    argv, expected = WRONG_KIND_OF_PATH[case]
    assert _one_line(capsys, main(argv)) == expected


def test_a_loose_file_says_what_a_run_folder_holds(demo, capsys) -> None:
    Path("notes.txt").write_text("x")
    line = _one_line(capsys, main(["finalize", "notes.txt"]))
    assert line == "invalid: notes.txt: is a file, not a run folder (a run folder holds mllog/)"


def test_a_submission_folder_for_an_mllog_names_every_runs_mllog(demo, capsys) -> None:
    line = _one_line(capsys, main(["check", "runs/demo"]))
    assert line.endswith("did you mean runs/demo/runs/seed_1/mllog/seed_1.out (or seed_2, seed_3)?")


# Every command that takes a path, given the submission folder: (argv, what it expected).
WITH_A_SUBMISSION_FOLDER = {
    "status": (["status", "runs/demo"], "a run folder"),
    "status --json": (["status", "runs/demo", "--json"], "a run folder"),
    "finalize": (["finalize", "runs/demo"], "a run folder"),
    "eval import": (["eval", "import", "runs/demo", "--step", "18", "s.json"], "a run folder"),
    "eval import --from-tree": (
        ["eval", "import", "runs/demo", "--from-tree", "t"],
        "a run folder",
    ),
    "manifest add": (
        [
            "manifest",
            "add",
            "runs/demo",
            "--step",
            "25",
            "--checkpoint",
            "c",
            "--timestamp-ms",
            "1",
        ],
        "a run folder",
    ),
    "run reset": (["run", "reset", "runs/demo"], "a run folder"),
    "manifest validate": (["manifest", "validate", "runs/demo"], "a manifest"),
    "check": (["check", "runs/demo"], "an MLLOG"),
}


@pytest.mark.parametrize("command", WITH_A_SUBMISSION_FOLDER)
def test_every_command_refuses_a_submission_folder_in_the_same_style(
    demo, capsys, tmp_path, command
) -> None:
    argv, expected = WITH_A_SUBMISSION_FOLDER[command]
    before = _files(tmp_path / "runs")
    line = _one_line(capsys, main(argv))
    assert line.startswith(f"invalid: runs/demo: is a submission folder, not {expected}")
    assert "; did you mean runs/demo/runs/seed_1" in line and line.endswith("(or seed_2, seed_3)?")
    assert _files(tmp_path / "runs") == before  # nothing written, nothing moved


# Every command, with a flag wrong: the usage line, then ``usage error: <what> (see ... --help)``.
USAGE_ERRORS = {
    "val-start": ["val-start"],
    "manifest validate": ["manifest", "validate"],
    "manifest add": ["manifest", "add", "r", "--step", "x"],
    "run reset": ["run", "reset"],
    "eval import": ["eval", "import", "r", "--step", str(2**64)],
    "finalize": ["finalize"],
    "status": ["status", "r", "--jsn"],
    "check": ["check", "log", "--division", "middle"],
    "forecast": ["forecast", "--window", "1", "--bogus"],
}


@pytest.mark.parametrize("command", USAGE_ERRORS)
def test_every_usage_error_has_the_same_prefix(capsys, command) -> None:
    with pytest.raises(SystemExit) as exited:
        main(USAGE_ERRORS[command])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    last = err.splitlines()[-1]
    assert out == "" and last.startswith("usage error: ") and "Traceback" not in err
    assert re.search(r"\(see rcpflow( [a-z-]+)* --help\)$", last), last
    assert not re.search(r"rcpflow[a-z -]*: error:", err), err  # argparse's own prefix is gone


def test_our_own_usage_errors_use_the_prefix_too(demo, capsys) -> None:
    code = main(["eval", "import", demo[1].run_dir, "--step", "18"])
    assert _one_line(capsys, code, 2) == (
        "usage error: give --step N SOURCE, or --from-tree DIR (see rcpflow eval import --help)"
    )
    code = main(["forecast", "--step-seconds", "many"])
    line = _one_line(capsys, code, 2)
    assert (
        line == "usage error: --step-seconds 'many' is not a number (see rcpflow forecast --help)"
    )


def test_status_shows_utc_times_and_json_keeps_milliseconds(demo, capsys) -> None:
    run = demo[1]
    assert main(["status", run.run_dir]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["step", "weight", "update", "(UTC)"]
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC"
    rows = [run.row(step) for step in range(run.val_start_at, run.max_steps + 1)]
    assert len(table) >= len(rows) + 1
    for line, row in zip(table[1:], rows, strict=False):
        assert re.fullmatch(rf"{row.step}\s+{stamp}\s+.*", line), line
        assert utc_text(row.timestamp_ms) in line
        assert str(row.timestamp_ms) not in line  # no raw milliseconds in the text
    assert main(["status", run.run_dir, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["timestamp_ms"] for s in data["steps"]] == [r.timestamp_ms for r in rows]


def test_utc_text_is_exact_to_the_millisecond() -> None:
    assert utc_text(1_700_000_000_123) == "2023-11-14 22:13:20.123 UTC"
    assert utc_text(1_700_000_000_999) == "2023-11-14 22:13:20.999 UTC"
    assert utc_text(1_577_836_800_000) == "2020-01-01 00:00:00.000 UTC"


def test_a_run_without_a_usable_manifest_is_one_invalid_line(tmp_path, capsys) -> None:
    run = make_run(str(tmp_path / "run"), max_steps=20)
    Path(run.layout.manifest).write_text("garbage\n")
    line = _one_line(capsys, main(["status", run.run_dir]))
    assert line.startswith(f"invalid: {run.run_dir}: no usable manifest: {run.layout.manifest}")
