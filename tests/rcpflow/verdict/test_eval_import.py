"""`rcpflow eval import`: each source format, what makes an import invalid, trees, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_records import (
    FIXTURES,
    START,
    STOP,
    deepswe_lines,
    r2egym_lines,
    solved_pattern,
    tunix_for,
    write_lines,
)
from rcpflow_cli import run_cli

from devtools.synthetic_run import make_run, write_eval
from rcpflow.records.manifest import load
from rcpflow.records.summary import read_summary
from rcpflow.verdict.eval_import import EvalImportError, import_eval, import_results_tree
from rcpflow.verdict.gate import valid_summary
from rcpflow.verdict.verify import evaluate_step


@pytest.fixture
def run(tmp_path):
    return make_run(str(tmp_path / "run"), max_steps=20)


def test_deepswe_records_retried_attempts_counted_once(run, tmp_path):
    mllog = Path(run.layout.mllog(run.seed)).read_bytes()
    source = write_lines(tmp_path / "deepswe.jsonl", deepswe_lines(retried=frozenset({3, 7, 200})))
    result = import_eval(run.run_dir, 18, source, eval_times=(START, STOP))
    s = result.summary
    assert result.format == "deepswe" and result.not_counted == 3
    assert (s.completed_attempts, s.missing_attempts, s.error_attempts) == (1004, 0, 0)
    assert s.eval_accuracy == pytest.approx(150 / 251)
    assert s.resolved_attempts == sum(sum(solved_pattern(t)) for t in range(251))
    assert set(s.status_counts) == {"SUCCEEDED", "MAX_CONTEXT_LIMIT_REACHED"}
    assert (s.checkpoint_step, s.checkpoint_timestamp_ms) == (18, run.row(18).timestamp_ms)
    assert (s.eval_start_ms, s.eval_stop_ms) == (START, STOP)
    assert Path(result.attempts_path).read_bytes() == Path(source).read_bytes()
    assert valid_summary(run.run_dir, run.row(18)) == s  # gate re-checks it with its attempts
    assert Path(run.layout.mllog(run.seed)).read_bytes() == mllog  # an import never logs
    first = Path(run.layout.summary(18)).read_bytes()
    import_eval(run.run_dir, 18, source, eval_times=(START, STOP))
    assert Path(run.layout.summary(18)).read_bytes() == first


def test_deepswe_task_with_fewer_than_four_valid_attempts_is_incomplete(run, tmp_path):
    lines = deepswe_lines()
    # task 5 sample 2: only an infrastructure failure, never a valid retry
    i = next(i for i, ln in enumerate(lines) if '"task_005' in ln and '"sample_index": 2' in ln)
    lines[i] = json.dumps(
        json.loads(lines[i])
        | {"valid": False, "solved": False, "status": "SANDBOX_ERROR", "reward": 0.0}
    )
    source = write_lines(tmp_path / "short.jsonl", lines)
    with pytest.raises(
        EvalImportError, match=r"1 task\(s\) with fewer than 4 valid attempts: r2e/task_005"
    ) as e:
        import_eval(run.run_dir, 18, source, eval_times=(START, STOP))
    assert "complete: incomplete (1 missing attempts)" in str(e.value)
    assert not Path(run.layout.summary(18)).exists()  # nothing written


def test_deepswe_duplicate_valid_record_is_invalid_naming_the_line(run, tmp_path):
    lines = deepswe_lines()
    lines.insert(10, lines[2])
    source = write_lines(tmp_path / "dup.jsonl", lines)
    with pytest.raises(
        EvalImportError,
        match=r"dup.jsonl: line 11: task r2e/task_000:latest attempt 2 is counted twice",
    ):
        import_eval(run.run_dir, 18, source, eval_times=(START, STOP))


def test_deepswe_record_that_contradicts_itself_is_invalid(run, tmp_path):
    lines = deepswe_lines()
    lines[0] = json.dumps(json.loads(lines[0]) | {"solved": False})  # reward 1.0, valid
    source = write_lines(tmp_path / "bad.jsonl", lines)
    with pytest.raises(
        EvalImportError, match=r"line 1: solved False but valid True and reward 1.0"
    ):
        import_eval(run.run_dir, 18, source, eval_times=(START, STOP))


def test_missing_tasks_are_missing_attempts(run, tmp_path):
    source = write_lines(tmp_path / "part.jsonl", deepswe_lines(tasks=range(64)))
    with pytest.raises(EvalImportError, match="64 of 251 tasks have records; 187 never ran"):
        import_eval(run.run_dir, 18, source, eval_times=(START, STOP))


def test_r2egym_trajectories_with_env_exceptions(run, tmp_path):
    source = write_lines(tmp_path / "r2e.jsonl", r2egym_lines(retried=frozenset({0, 1})))
    result = import_eval(run.run_dir, 19, source, eval_times=(START, STOP))
    assert result.format == "r2egym" and result.not_counted == 2
    assert result.summary.eval_accuracy == pytest.approx(150 / 251)
    assert result.summary.status_counts == {"agent": 1004}
    lines = r2egym_lines()
    lines.insert(0, lines[0])  # R2E-Gym numbers no attempts: a fifth valid one is too many
    source = write_lines(tmp_path / "r2e5.jsonl", lines)
    with pytest.raises(EvalImportError, match=r"task namanjain12/r2e_000: 5 counted attempts"):
        import_eval(run.run_dir, 19, source, eval_times=(START, STOP))


def test_rcpflow_attempts_and_format_mismatch(run, tmp_path):
    lines = [
        json.dumps(
            {
                "instance": i,
                "attempt": a,
                "status": "resolved" if solved else "failed",
                "reward": 1.0 if solved else 0.0,
                "prompt": [1],
                "completion": [2],
            }
        )
        for i in range(251)
        for a, solved in enumerate(solved_pattern(i))
    ]
    source = write_lines(tmp_path / "attempts.jsonl", lines)
    with pytest.raises(EvalImportError, match="--format deepswe but the file is rcpflow-attempts"):
        import_eval(run.run_dir, 18, source, eval_times=(START, STOP), fmt="deepswe")
    result = import_eval(run.run_dir, 18, source, eval_times=(START, STOP))
    assert result.format == "rcpflow-attempts"
    assert result.summary.eval_accuracy == pytest.approx(150 / 251)


def test_attempts_beside_a_summary_that_disagree_with_it(run, tmp_path):
    """A foreign attempts file whose pass@4 disagrees with the summary next to it."""
    good = write_lines(tmp_path / "ok" / "attempts" / "attempts.jsonl", deepswe_lines())
    result = import_eval(run.run_dir, 18, good, eval_times=(START, STOP))
    summary_dir = tmp_path / "foreign"
    (summary_dir / "attempts").mkdir(parents=True)
    (summary_dir / "summary.json").write_bytes(Path(result.summary_path).read_bytes())
    lines = deepswe_lines()
    for i, ln in enumerate(lines):  # task 0 was solved in sample 0 only: now never
        if '"task_000' in ln and '"sample_index": 0' in ln:
            lines[i] = json.dumps(json.loads(ln) | {"solved": False, "reward": 0.0})
    write_lines(summary_dir / "attempts" / "attempts.jsonl", lines)
    with pytest.raises(
        EvalImportError, match=r'pass_at_k\["4"\]: 0.597\d+ but .*attempts.jsonl gives 0.593'
    ):
        import_eval(run.run_dir, 19, str(summary_dir / "summary.json"))
    # the same summary with its true attempts imports, and the attempts come along
    (summary_dir / "attempts" / "attempts.jsonl").write_text(Path(good).read_text())
    d = json.loads((summary_dir / "summary.json").read_text())
    d.update(
        checkpoint_step=19,
        checkpoint_timestamp_ms=run.row(19).timestamp_ms,
        samples_count=run.row(19).samples_count,
    )
    (summary_dir / "summary.json").write_text(json.dumps(d))
    again = import_eval(run.run_dir, 19, str(summary_dir / "summary.json"))
    assert again.times_from == "source" and again.attempts_path is not None
    # a planted attempts file that disagrees with the run's summary makes it invalid in place
    Path(again.attempts_path).write_text("\n".join(lines) + "\n")
    found = evaluate_step(run.run_dir, run.row(19))
    assert found.state == "invalid" and any('pass_at_k["4"]' in p for p in found.problems)


def test_summary_of_another_checkpoint_and_missing_times(run, tmp_path):
    source = tmp_path / "summary.json"
    source.write_text((FIXTURES / "summary_full.json").read_text())  # step 2 of another run
    with pytest.raises(EvalImportError, match=r"no eval_start_ms/eval_stop_ms.*never invented"):
        import_eval(run.run_dir, 18, str(source))
    with pytest.raises(EvalImportError) as e:
        import_eval(run.run_dir, 18, str(source), eval_times=(START, STOP))
    assert "checkpoint_step: 2 != manifest's 18" in str(e.value)
    assert "samples_count: 512 != manifest's 4608" in str(e.value)
    with pytest.raises(EvalImportError, match="step 17: not in manifest"):
        import_eval(run.run_dir, 17, str(source), eval_times=(START, STOP))


def test_from_tree_takes_the_newest_valid_attempt_per_step(run, tmp_path):
    tree = tmp_path / "eval_results_v3"
    plant = {
        (18, "20260929T060823Z-f604fb47"): tunix_for(run, 18, "summary_step1.json"),
        (18, "20260929T070000Z-0badbeef"): tunix_for(run, 18, "summary_smoke.json"),  # newer
        (19, "20260929T080000Z-11111111"): tunix_for(run, 19, "summary_full.json"),
        (20, "20260929T090000Z-22222222"): tunix_for(run, 20, "summary_full.json", False),
    }
    for (step, stamp), d in plant.items():
        path = tree / f"step_{step}" / stamp / "summary.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(d))
    result = import_results_tree(run.run_dir, str(tree))
    by_step = {s.step: s for s in result.steps}
    assert by_step[18].imported.source.endswith("20260929T060823Z-f604fb47/summary.json")
    assert [src for src, _ in by_step[18].rejected] == [
        str(tree / "step_18" / "20260929T070000Z-0badbeef" / "summary.json")
    ]
    assert "instances: 64" in by_step[18].rejected[0][1]
    assert by_step[19].imported.summary.eval_accuracy == pytest.approx(180 / 251)
    assert by_step[20].imported is None and "never invented" in by_step[20].rejected[0][1]
    assert not result.all_imported
    p = run_cli("eval", "import", run.run_dir, "--from-tree", str(tree))
    assert p.returncode == 1, p.stderr
    assert "step 18: imported tunix-summary" in p.stdout and "step 20: nothing imported" in p.stdout


def test_cli_exit_codes(run, tmp_path):
    source = write_lines(tmp_path / "deepswe.jsonl", deepswe_lines(retried=frozenset({9})))
    common = ("eval", "import", run.run_dir, "--step", "18", source)
    p = run_cli(*common, "--eval-start-ms", str(START))
    assert p.returncode == 2 and "--eval-start-ms and --eval-stop-ms go together" in p.stderr
    p = run_cli(*common)
    assert p.returncode == 1 and "never invented" in p.stderr and "Traceback" not in p.stderr
    p = run_cli(*common, "--eval-start-ms", str(START), "--eval-stop-ms", str(STOP))
    assert p.returncode == 0, p.stderr
    (line,) = p.stdout.splitlines()
    assert line.startswith("step 18: imported deepswe") and "1 retried" in line
    assert (
        run_cli(
            "eval", "import", run.run_dir, "--from-tree", str(tmp_path), "--step", "3"
        ).returncode
        == 2
    )
    assert run_cli("eval", "import", run.run_dir, "--format", "nope").returncode == 2


def test_imported_summaries_finalize(run, tmp_path):
    from rcpflow.verdict.finalize import finalize

    write_eval(run, 18, 0.5)
    source = write_lines(tmp_path / "r2e.jsonl", r2egym_lines())
    import_eval(run.run_dir, 19, source, eval_times=(START, STOP))
    d = tunix_for(run, 20, "summary_full.json")
    (tmp_path / "s20.json").write_text(json.dumps(d))
    import_eval(run.run_dir, 20, str(tmp_path / "s20.json"))
    result = finalize(run.run_dir)
    assert (result.status, result.step) == ("success", 20)
    assert load(run.layout.manifest).row(20).timestamp_ms == result.time_ms
    assert read_summary(run.layout.summary(20)).target_reached


def test_eval_start_then_import_since_takes_only_what_the_job_left(run, tmp_path):
    """`eval start` / `eval import --since` (the Slurm batch script's form of the evaluate
    step's rule, `import_new_result`): an attempt that was in the tree before the start is
    never imported; a new one is, with the times from the start to the import; a refused
    import writes nothing and says why in one line."""
    tree = tmp_path / "tree"

    def plant(step: int, stamp: str) -> None:
        path = tree / f"step_{step}" / stamp / "summary.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(tunix_for(run, step, "summary_full.json", False)))

    plant(19, "0-old")
    args = ("eval", "start", run.run_dir, str(tree), "--format", "tunix-tree")
    started = {s: run_cli(*args, "--step", str(s)) for s in (18, 19)}
    assert all(p.returncode == 0 for p in started.values()), started
    since = {s: p.stdout.strip() for s, p in started.items()}
    assert json.loads(since[19])["baseline"]["attempts"] == [
        str(tree / "step_19" / "0-old" / "summary.json")
    ]
    plant(18, "1-new")

    def since_import(step: int) -> object:
        return run_cli(
            "eval", "import", run.run_dir, str(tree), "--step", str(step),
            "--format", "tunix-tree", "--since", since[step],
        )  # fmt: skip

    ok = since_import(18)
    assert ok.returncode == 0, ok.stderr
    summary = read_summary(run.layout.summary(18))
    assert summary.eval_start_ms == json.loads(since[18])["ms"] <= summary.eval_stop_ms
    old = since_import(19)
    assert old.returncode == 1 and "left no new attempt under" in old.stderr, old.stderr
    assert old.stderr.count("\n") == 1 and not Path(run.layout.summary(19)).exists()
    for bad, words in (
        (("--format", "tunix-tree", "--since", "{}"), "not what `rcpflow eval start` prints"),
        (
            (
                "--format",
                "tunix-tree",
                "--since",
                json.dumps({**json.loads(since[18]), "ms": 2**62}),
            ),
            "ms must be a past time",
        ),
        (("--since", since[18]), "--since needs the result's --format"),
        (("--since", since[18], "--reopen"), "--since takes no"),
        (("--format", "tunix-tree"), "goes with --since"),
    ):
        p = run_cli("eval", "import", run.run_dir, str(tree), "--step", "18", *bad)
        assert words in p.stderr and p.returncode in (1, 2), (bad, p.stderr)
