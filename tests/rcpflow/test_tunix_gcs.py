"""A run as Tunix's MLPerf pipeline leaves it, on the GCS emulator: its manifest rows (absolute
gs:// paths, val_start_at 1, max_steps 2), its summaries at a Tunix-style tree. Imported with the
pipeline's eval clock, finalized, and judged by the official compliance checker; the 64-instance
smoke summaries can never end the run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from rcpflow_cli import cli_env, run_cli

from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.files.storage import storage_for
from rcpflow.records.mllog import SystemInfo, TrainingLog, read_events
from rcpflow.records.summary import EvalSummary, write_summary
from rcpflow.submission import checkers
from rcpflow.verdict.eval_import import import_results_tree
from rcpflow.verdict.finalize import finalize

pytestmark = [pytest.mark.gcs, pytest.mark.timeout(300)]

FIXTURES = Path(__file__).parent / "fixtures" / "tunix"
# The eval clock of Tunix's step 1 (eval_start, validation_time 1697.76 s), and a later one.
EVAL_TIMES = {1: (1790662429020, 1790664126780), 2: (1790664200000, 1790665900000)}
STAMPS = {1: "20260929T060823Z-f604fb47", 2: "20260929T063700Z-9c1d22e0"}
SMOKE_STAMP = "20260929T050000Z-deadbeef"  # older than the full attempts


def tunix_run(root: str) -> RunLayout:
    """Manifest rows from the fixture, and a training log (open division: val_start_at 1)."""
    layout = RunLayout(root)
    rows = (FIXTURES / "eval_checkpoints.jsonl").read_text().replace("{root}", root)
    storage_for(layout.manifest).write_atomic(layout.manifest, rows.encode())
    hp = recipe.hyperparameters("open", global_batch_size=256, max_steps=2)
    log = TrainingLog(layout.mllog(0))
    t0 = 1790658000000
    log.training_header(hp, 0, SystemInfo(), train_samples=512, time_ms=t0)
    log.init_stop(t0 + 60_000)
    log.run_start(t0 + 60_000)
    log.block_start(0, 0, t0 + 60_000)
    log.block_stop(512, 2, 1790660000000)  # backdated to step 2's weight update
    return layout


def put(path: str, text: str) -> str:
    storage_for(path).write_atomic(path, text.encode())
    return path


def import_step(
    env: dict[str, str], run_dir: str, step: int, source: str, times: tuple[int, int]
) -> subprocess.CompletedProcess[str]:
    """`rcpflow eval import` of one step's summary with the pipeline's eval times."""
    start, stop = times
    return run_cli(
        "eval", "import", run_dir, "--step", str(step), source,
        "--eval-start-ms", str(start), "--eval-stop-ms", str(stop), env=cli_env(**env),
    )  # fmt: skip


def test_tunix_summaries_import_finalize_and_pass_the_checker(gcs, gcs_prefix, tmp_path):
    layout = tunix_run(gcs_prefix + "/run")
    tree = gcs_prefix + "/eval_results_v3"
    fixture = {1: "summary_step1.json", 2: "summary_full.json"}
    sources = {
        step: put(f"{tree}/step_{step}/{STAMPS[step]}/summary.json", (FIXTURES / name).read_text())
        for step, name in fixture.items()
    }
    smoke = put(
        f"{tree}/step_1/{SMOKE_STAMP}/summary.json", (FIXTURES / "summary_smoke.json").read_text()
    )
    log_before = storage_for(layout.mllog(0)).read_bytes(layout.mllog(0))

    p = import_step(gcs.env, layout.root, 1, smoke, EVAL_TIMES[1])
    assert p.returncode == 1 and "instances: 64, the benchmark evaluates 251" in p.stderr
    assert not storage_for(layout.summary(1)).exists(layout.summary(1))
    for step, source in sources.items():
        p = import_step(gcs.env, layout.root, step, source, EVAL_TIMES[step])
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(f"step {step}: imported tunix-summary {source}")
    assert storage_for(layout.mllog(0)).read_bytes(layout.mllog(0)) == log_before

    p = run_cli("finalize", layout.root, env=cli_env(**gcs.env))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == {
        "status": "success",
        "step": 2,
        "samples_count": 512,
        "time_ms": 1790660000000,
    }
    events = read_events(layout.mllog(0))
    (stop,) = [e for e in events if e.key == "run_stop"]
    assert stop.time_ms == 1790660000000 and stop.metadata["status"] == "success"
    stats = [e for e in events if e.key == "tracked_stats"]
    assert stats[0].value == {"validation_time": 1697.76}
    result = checkers.compliance(layout.mllog(0), "open", log_dir=str(tmp_path / "checks"))
    assert result.ok, result.output


def test_smoke_summaries_never_yield_run_stop(gcs, gcs_prefix):
    layout = tunix_run(gcs_prefix + "/run")
    tree = gcs_prefix + "/smoke_tree"
    for step in (1, 2):
        d = json.loads((FIXTURES / "summary_smoke.json").read_text())
        d.update(
            checkpoint_step=step,
            samples_count=256 * step,
            checkpoint_timestamp_ms={1: 1790659000000, 2: 1790660000000}[step],
        )
        d.update(zip(("eval_start_ms", "eval_stop_ms"), EVAL_TIMES[step], strict=True))
        put(f"{tree}/step_{step}/{SMOKE_STAMP}/summary.json", json.dumps(d))
        # and as if another tool had written it straight into the run, bypassing the import
        write_summary(layout.summary(step), EvalSummary.from_dict(d, "smoke"))
    imported = import_results_tree(layout.root, tree)
    assert [s.imported for s in imported.steps] == [None, None]
    assert all("instances: 64" in why for s in imported.steps for _, why in s.rejected)
    result = finalize(layout.root)
    assert result.status == "incomplete" and "instances: 64" in result.reason
    assert not [e for e in read_events(layout.mllog(0)) if e.key == "run_stop"]
