"""rcpflow.submission.package builds a submission folder that the official package checker and
result summarizer accept; runs are written by rcpflow itself (tests/synthetic_run.py + finalize)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from devtools.synthetic_run import STEP_MS, make_run
from rcpflow import recipe
from rcpflow.submission import checkers
from rcpflow.submission.package import STATUSES, SystemDescription, local_system, package_submission
from rcpflow.verdict.finalize import finalize

pytestmark = pytest.mark.timeout(240)

SEEDS = (1, 2, 3)
CONVERGES_AT = {1: 19, 2: 18, 3: 20}  # seed -> first step with pass@4 > 0.69
NEVER = {step: 0.68 for step in range(18, 25)}  # aborted at max_steps 24


def accuracies_converging_at(step: int) -> dict[int, float]:
    return {s: (0.75 if s == step else 0.5) for s in range(18, step + 1)}


def finalized_run(
    root: str, seed: int, accuracies: Mapping[int, float], division: str = "closed"
) -> str:
    run = make_run(f"{root}/run_{seed}", seed=seed, accuracies=accuracies, division=division)
    finalize(run.run_dir)
    return run.run_dir


@pytest.fixture
def three_runs(tmp_path: Path) -> list[str]:
    return [
        finalized_run(str(tmp_path / "runs"), s, accuracies_converging_at(CONVERGES_AT[s]))
        for s in SEEDS
    ]


def tree(folder: str) -> dict[str, bytes]:
    return {
        os.path.relpath(os.path.join(d, f), folder): Path(d, f).read_bytes()
        for d, _, files in os.walk(folder)
        for f in files
    }


def test_layout_and_contents(three_runs: list[str], tmp_path: Path) -> None:
    org = package_submission(three_runs, SEEDS, str(tmp_path / "out"), SystemDescription())
    assert org == str(tmp_path / "out" / "submission")
    bench = f"results/rcpflow-local-cpu/{recipe.BENCHMARK}"
    files = tree(org)
    assert sorted(files) == [
        f"benchmarks/{recipe.BENCHMARK}/README.md",
        f"{bench}/result_0.txt",
        f"{bench}/result_1.txt",
        f"{bench}/result_2.txt",
        "systems/rcpflow-local-cpu.json",
    ]
    for i, (run, seed) in enumerate(zip(three_runs, SEEDS, strict=True)):
        log = Path(run, "mllog", f"seed_{seed}.out").read_bytes()
        assert files[f"{bench}/result_{i}.txt"] == log
    desc = json.loads(files["systems/rcpflow-local-cpu.json"])
    assert desc["division"] == "closed"  # taken from the runs' logs
    assert desc["submitter"] == "rcpflow"  # the logs' submission_org
    assert desc["status"] == "Research, Development, or Internal (RDI)"
    assert "accelerator_on-chip_memories" in desc


def test_system_description_passes_the_official_system_checker(tmp_path: Path) -> None:
    from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc

    for system in (
        SystemDescription(division="closed", submitter="me"),
        local_system(division="open", submitter="me"),
    ):
        path = tmp_path / f"{system.system_name}-{system.division}.json"
        path.write_text(system.to_json())
        valid, name, _, _ = check_system_desc(str(path), "training", recipe.RULESET)
        assert valid and name == system.system_name
    # ...and that checker really rejects what is missing (so the check above means something).
    broken = json.loads(SystemDescription(division="closed", submitter="me").to_json())
    del broken["cooling"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    assert not check_system_desc(str(path), "training", recipe.RULESET)[0]


def test_local_system_describes_this_host() -> None:
    system = local_system()
    assert system.host_processor_core_count == str(os.cpu_count())
    assert system.accelerators_per_node == "0"
    assert "mlperf-logging" in system.other_software_stack


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("status", "research", "status must be one of"),
        ("division", "closd", "division must be one of"),
        ("number_of_nodes", "0", "number_of_nodes must be a whole number >= 1"),
        ("accelerators_per_node", "eight", "accelerators_per_node must be a whole number"),
        ("system_name", "my/system", "system_name 'my/system' names a folder"),
        ("cooling", "", "cooling must not be empty"),
        ("host_processor_core_count", 2, "host_processor_core_count must be a string"),
    ],
)
def test_system_description_errors_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SystemDescription(**{field: value})  # type: ignore[arg-type]


def test_to_json_needs_what_the_runs_would_have_filled_in() -> None:
    with pytest.raises(ValueError, match="division is not set"):
        SystemDescription(submitter="me").to_json()
    with pytest.raises(ValueError, match="submitter is not set"):
        SystemDescription(division="open").to_json()


def test_repackaging_gives_the_same_bytes_and_drops_stale_results(
    three_runs: list[str], tmp_path: Path
) -> None:
    out = str(tmp_path / "out")
    fourth = finalized_run(str(tmp_path / "runs"), 4, accuracies_converging_at(18))
    package_submission([*three_runs, fourth], [*SEEDS, 4], out)
    assert "result_3.txt" in os.listdir(
        f"{out}/submission/results/rcpflow-local-cpu/{recipe.BENCHMARK}"
    )
    org = package_submission(three_runs, SEEDS, out)
    first = tree(org)
    assert package_submission(three_runs, SEEDS, out) == org
    assert tree(org) == first
    assert not any(p.endswith("result_3.txt") for p in first)


def test_code_dirs_are_copied_without_caches(three_runs: list[str], tmp_path: Path) -> None:
    code = tmp_path / "my_impl"
    (code / "pkg" / "__pycache__").mkdir(parents=True)
    (code / "pkg" / "train.py").write_text("print('seed')\n")
    (code / "pkg" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    org = package_submission(three_runs, SEEDS, str(tmp_path / "out"), code_dirs=[str(code)])
    impl = f"benchmarks/{recipe.BENCHMARK}/implementations/my_impl"
    assert [p for p in tree(org) if p.startswith(impl)] == [f"{impl}/pkg/train.py"]


def test_bad_inputs_are_refused_by_name(three_runs: list[str], tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"seeds: \[1\] used by more than one run"):
        package_submission(three_runs, [1, 1, 3], out)
    with pytest.raises(ValueError, match="seeds: 2 seeds for 3 run_dirs"):
        package_submission(three_runs, [1, 2], out)
    with pytest.raises(FileNotFoundError, match="no MLLOG for seed 7"):
        package_submission(three_runs[:1], [7], out)
    with pytest.raises(ValueError, match="division: 'open', but the runs' logs say 'closed'"):
        package_submission(three_runs, SEEDS, out, division="open")
    with pytest.raises(ValueError, match=r"system\.division: 'open'"):
        package_submission(three_runs, SEEDS, out, SystemDescription(division="open"))
    with pytest.raises(ValueError, match=r"system\.submitter: 'acme', but the runs' logs say"):
        package_submission(three_runs, SEEDS, out, SystemDescription(submitter="acme"))
    open_run = finalized_run(str(tmp_path / "open"), 9, accuracies_converging_at(18), "open")
    with pytest.raises(ValueError, match="division: the runs disagree"):
        package_submission([three_runs[0], open_run], [1, 9], out)
    assert not os.path.exists(f"{out}/submission")  # nothing written by refused calls


def _log_states_seed(run_dir: str, index: int, logged: int) -> None:
    """The run's log states `logged` as its seed (as NeMo-RL's launcher draws its own)."""
    log = Path(run_dir, "mllog", f"seed_{index}.out")
    text = log.read_text()
    marker = f'"key": "seed", "value": {index},'
    assert text.count(marker) == 1, marker
    log.write_text(text.replace(marker, f'"key": "seed", "value": {logged},'))


def test_a_logged_seed_of_its_own_is_accepted_when_distinct_and_recorded(
    three_runs: list[str], tmp_path: Path
) -> None:
    for index, logged in zip(SEEDS, (2115446333, 998877, 31337), strict=True):
        _log_states_seed(three_runs[index - 1], index, logged)
    org = package_submission(three_runs, SEEDS, str(tmp_path / "out"), local_system())
    readme = Path(org, "benchmarks", recipe.BENCHMARK, "README.md").read_text()
    assert "result_0.txt: seed 1 (its log states seed 2115446333)," in readme
    result = checkers.package(org, log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output  # the official seed checker: distinct seeds


def test_one_logged_seed_in_two_runs_is_refused_naming_both_logs(
    three_runs: list[str], tmp_path: Path
) -> None:
    _log_states_seed(three_runs[0], 1, 2115446333)
    _log_states_seed(three_runs[2], 3, 2115446333)
    out = str(tmp_path / "out")
    with pytest.raises(ValueError) as e:
        package_submission(three_runs, SEEDS, out)
    said = str(e.value)
    assert said.startswith("seeds: the logs of 2 runs state seed 2115446333 (")
    assert "run_1/mllog/seed_1.out" in said and "run_3/mllog/seed_3.out" in said
    assert "\n" not in said and not os.path.exists(f"{out}/submission")


def test_package_checker_accepts_three_converged_closed_runs(
    three_runs: list[str], tmp_path: Path
) -> None:
    org = package_submission(three_runs, SEEDS, str(tmp_path / "out"), local_system())
    result = checkers.package(org, log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output
    assert result.errors == ()
    assert "Running Seed Checker" in result.output  # closed: seeds and RCPs were checked
    assert "RCP Test Passed: RCP found" in result.output


def test_package_checker_rejects_a_repeated_seed(three_runs: list[str], tmp_path: Path) -> None:
    org = package_submission(three_runs, SEEDS, str(tmp_path / "out"))
    bench = Path(org, "results", "rcpflow-local-cpu", recipe.BENCHMARK)
    # A "third run" that is the first one again: same seed logged on the same source line.
    shutil.copyfile(bench / "result_0.txt", bench / "result_2.txt")
    result = checkers.package(org, log_dir=str(tmp_path / "checks"))
    assert result.returncode == 0  # the tool always exits 0...
    assert not result.ok  # ...so the verdict comes from its last lines
    assert "Seed checker failed" in result.errors
    assert any("logs seed 1 on rcpflow/records/mllog.py" in e for e in result.errors), result.errors


def test_package_checker_rejects_a_wrong_number_of_runs(
    three_runs: list[str], tmp_path: Path
) -> None:
    org = package_submission(three_runs[:2], SEEDS[:2], str(tmp_path / "out"))
    result = checkers.package(org, log_dir=str(tmp_path / "checks"))
    assert not result.ok
    assert any("found 2, expected 3" in e for e in result.errors), result.errors


def test_package_checker_accepts_open_division_runs(tmp_path: Path) -> None:
    runs = [
        finalized_run(str(tmp_path / "runs"), s, accuracies_converging_at(CONVERGES_AT[s]), "open")
        for s in SEEDS
    ]
    org = package_submission(runs, SEEDS, str(tmp_path / "out"))
    assert json.loads(Path(org, "systems", "rcpflow-local-cpu.json").read_text())["division"] == (
        "open"
    )
    result = checkers.package(org, log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output
    assert "Running Seed Checker" not in result.output  # open: no seed or RCP rules


def test_result_summary_scores_the_olympic_mean(three_runs: list[str], tmp_path: Path) -> None:
    org = package_submission(three_runs, SEEDS, str(tmp_path / "out"))
    result = checkers.result_summary(org, log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output
    # run_stop is backdated to the passing step's weight update: 18, 19, 20 steps after
    # run_start; the olympic mean drops the fastest and the slowest.
    assert result.score_minutes == pytest.approx(19 * STEP_MS / 60_000)
    assert Path(tmp_path / "checks" / "result_summary.csv").exists()
    assert not Path(tmp_path / "out" / "summary.json").exists()


def test_result_summary_has_no_score_when_two_runs_did_not_converge(
    three_runs: list[str], tmp_path: Path
) -> None:
    runs = [
        three_runs[0],
        finalized_run(str(tmp_path / "bad"), 2, NEVER),
        finalized_run(str(tmp_path / "bad"), 3, NEVER),
    ]
    org = package_submission(runs, SEEDS, str(tmp_path / "out"))
    result = checkers.result_summary(org, log_dir=str(tmp_path / "checks"))
    assert not result.ok
    assert result.score_minutes is None
    assert any("Too many non-converging runs" in e for e in result.errors), result.errors


@pytest.mark.gcs
def test_runs_and_submission_on_gcs(gcs_prefix: str, tmp_path: Path) -> None:
    runs = [
        finalized_run(f"{gcs_prefix}/runs", s, accuracies_converging_at(CONVERGES_AT[s]))
        for s in SEEDS
    ]
    org = package_submission(runs, SEEDS, f"{gcs_prefix}/out")
    assert org == f"{gcs_prefix}/out/submission"
    result = checkers.package(org, log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output
    assert STATUSES[2] in Path(result.command[3], "systems", "rcpflow-local-cpu.json").read_text()
