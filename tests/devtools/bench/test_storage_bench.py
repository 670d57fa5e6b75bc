"""devtools/bench/storage_bench.py: a forecast run replayed on files, with retention and without;
the peaks it samples agree with the storage forecast and retention lowers them."""

from __future__ import annotations

from pathlib import Path

from devtools.bench import storage_bench
from devtools.bench.storage_bench import replay
from rcpflow.planning.forecast import Scenario, simulate
from rcpflow.planning.storage_forecast import TB, CheckpointSizes, storage


def test_retention_lowers_the_peak_the_forecast_predicts(tmp_path: Path) -> None:
    # evaluations keep pace (W = 3 of 2-step evaluations): at most W + 2 checkpoints stay
    f = simulate(Scenario(10.0, 20.0, 18, 30, 24, "during_training", 3))
    without = replay(f, str(tmp_path / "without"), retention=False)
    kept = replay(f, str(tmp_path / "with"), retention=True)
    written = f.steps_trained - 18 + 1
    assert without.peak_checkpoints == written
    assert kept.peak_checkpoints <= 3 + 2 + 1 < written
    sizes = CheckpointSizes(
        storage_bench.WEIGHTS_BYTES / TB, storage_bench.STATE_BYTES / TB, storage_bench.FULL_EVERY
    )
    assert without.peak_bytes == round(storage(f, sizes, retention=False).peak_tb * TB)
    assert kept.peak_bytes == round(storage(f, sizes, retention=True).peak_tb * TB)
    assert kept.peak_bytes < without.peak_bytes
    assert not any((tmp_path / "with" / "checkpoints").glob("2[0-3]"))  # below the passing step


def test_the_section_goes_between_its_markers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(storage_bench, "ROWS", (("during_training", 10),))
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\nother\n")
    assert storage_bench.main(["--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nother\n") and storage_bench.START in text
    (row,) = [line for line in text.splitlines() if line.startswith("| during_training | 10 |")]
    assert "(within W+2+1 = 13)" in row


def test_the_sampler_counts_step_folders_and_remembers_each_one_written(tmp_path: Path) -> None:
    from devtools.bench.proportions_bench import CheckpointSampler

    run = tmp_path / "seed_1"
    sampler = CheckpointSampler({1: run})
    sampler.sample()  # no checkpoints/ yet
    for step in (18, 19):
        (run / "checkpoints" / str(step)).mkdir(parents=True)
        (run / "checkpoints" / str(step) / "checkpoint.json").write_bytes(b"x" * 100)
    (run / "checkpoints" / "tmp-write").mkdir()  # not a step folder
    sampler.sample()
    (run / "checkpoints" / "18" / "checkpoint.json").unlink()
    (run / "checkpoints" / "18").rmdir()  # retention took it
    (run / "checkpoints" / "20").mkdir()
    sampler.sample()
    assert sampler.storage() == ((1, 3, 2, 200),)


def _retention_tasks() -> list[dict]:
    """Step 18's wait ended at 58 s, its evaluate task ended at 100 s (a slot held 42 s)."""
    return [
        {"task_id": "evaluation.checkpoint.wait", "map_index": 0, "state": "success",
         "start_date": 10.0, "end_date": 58.0},
        {"task_id": "evaluation.checkpoint.evaluate", "map_index": 0, "state": "success",
         "start_date": 60.0, "end_date": 100.0},
    ]  # fmt: skip


def _saved(
    schedule: str, window: int, peaks: list[tuple[int, int]], load: str, retention: bool = True
) -> dict:
    """A configuration as proportions_bench.saved_row keeps it: seeds passing at 20, 23, 19;
    step 18's evaluation ended at 95 s and, with `retention`, its checkpoint went at 99 s."""
    seeds = [
        {
            "seed": s,
            "passing_step": p,
            "task_start_s": [2.0, 3.0],
            "steps_trained": 60,
            "tasks": _retention_tasks(),
            "evaluations": [[18, 62.0, 95.0]],
            "deletions": [[18, 99.0], [40, 300.0]] if retention else [],
        }
        for s, p in ((1, 20), (2, 23), (3, 19))
    ]
    storage = [[s, 43, count, size] for s, (count, size) in zip((1, 2, 3), peaks, strict=True)]
    return {"schedule": schedule, "window": window, "seeds": seeds, "storage": storage,
            "load": load}  # fmt: skip


def test_the_rehearsal_section_shows_the_worst_seeds_peaks_and_the_forecast(
    tmp_path: Path,
) -> None:
    import json

    rows = [
        {
            "schedule": "during_training",
            "window": 10,
            "scale": 0.01,
            "without": _saved("during_training", 10, [(40, 4000), (43, 4300), (39, 3900)], "1"),
            "kept": _saved("during_training", 10, [(9, 900), (12, 1200), (8, 800)], "2"),
        },
        {
            "schedule": "during_training",
            "window": 3,
            "scale": 0.1,
            "without": _saved("during_training", 3, [(43, 4300)] * 3, "3"),
            "kept": _saved("during_training", 3, [(43, 4300)] * 3, "4", retention=False),
        },
    ]
    saved = tmp_path / "storage_rehearsal.json"
    saved.write_text(json.dumps(rows))
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n")
    assert storage_bench.main(["--out", str(out), "--rehearsal-from", str(saved)]) == 0
    text = out.read_text()
    assert storage_bench.REHEARSAL_START in text and storage_bench.REHEARSAL_END in text
    (row,) = [line for line in text.splitlines() if line.startswith("| during_training | 10 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:7] == [
        "0.01 (1.85 s, 17.0 s)", "43", "43", "12 (within W+2 = 12)", f"{1200 / 4300:.2f}"
    ]  # fmt: skip
    # the forecast's peaks: with retention below the written checkpoints, without all of them;
    # the row's measured lag (4 s from step 18's evaluation's end to its deletion; the deletion
    # of 40, never evaluated, is no lag) keeps checkpoints longer: more of them
    lagged, at_once, without_forecast = (int(c.split()[0]) for c in cells[7:10])
    assert at_once < lagged < without_forecast
    assert cells[7] == f"{lagged} ({12 / lagged:.2f})"  # measured / forecast
    assert "1 (without), 2 (with)" in text
    assert (
        "- during_training W=10 at 0.01: a slot held per evaluation (a wait's end to its "
        "evaluate task's end) 42.0 s (median) (more than W steps), W steps 18.5 s, an "
        "evaluation 17.0 s; an evaluation's end to its checkpoint's deletion 4.0 s (median)"
    ) in text
    assert "the median from an evaluation's end to its checkpoint's deletion" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| during_training | 3 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "0.1 (18.50 s, 170.0 s)" and cells[7] == "none ran"
    assert (
        "W=3 at 0.1: a slot held per evaluation (a wait's end to its evaluate task's end) "
        "42.0 s (median) (within W steps)"
    ) in text
    assert "an evaluation's end to its checkpoint's deletion (none ran)" in text
