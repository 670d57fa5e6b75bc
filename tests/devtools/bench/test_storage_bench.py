"""devtools/bench/storage_bench.py: a forecast run replayed on files, with retention and without;
the peaks it samples agree with the storage forecast and retention lowers them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from measured_rows import row

from devtools.bench import proportions_bench as pb
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


def _saved(window: int, peaks: list[tuple[int, int]], load: str, retention: bool) -> dict:
    """A during-training configuration as proportions_bench.saved_row keeps it (three seeds
    passing at 19, `measured_rows.row`), each seed's (peak checkpoints, bytes) in `peaks`; with
    `retention`, each evaluated step's checkpoint deleted 0.4 s after its evaluation's end
    and step 40 (never evaluated) at 300 s."""
    measured = row(window, (2, 2))
    seeds = tuple(
        dataclasses.replace(
            s,
            deletions=[[e[0], e[2] + 0.4] for e in s.evaluations] + [[40, 300.0]]
            if retention
            else [],
        )
        for s in measured.seeds
    )
    storage = tuple(
        (s.seed, 43, count, size) for s, (count, size) in zip(seeds, peaks, strict=True)
    )
    return pb.saved_row(
        measured._replace(schedule="during_training", seeds=seeds, load=load, storage=storage)
    )


def test_the_rehearsal_section_shows_the_worst_seeds_peaks_and_the_forecast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pb.os, "cpu_count", lambda: 2)
    rows = [
        {
            "schedule": "during_training",
            "window": 10,
            "scale": 0.01,
            "without": _saved(10, [(40, 4000), (43, 4300), (39, 3900)], "1", retention=False),
            "kept": _saved(10, [(9, 900), (12, 1200), (8, 800)], "2", retention=True),
        },
        {
            "schedule": "during_training",
            "window": 3,
            "scale": 0.1,
            "without": _saved(3, [(43, 4300)] * 3, "3", retention=False),
            "kept": _saved(3, [(43, 4300)] * 3, "4", retention=False),
        },
    ]
    saved = tmp_path / "storage_rehearsal.json"
    saved.write_text(json.dumps(rows))
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n")
    assert storage_bench.main(["--out", str(out), "--rehearsal-from", str(saved)]) == 0
    text = out.read_text()
    assert storage_bench.REHEARSAL_START in text and storage_bench.REHEARSAL_END in text
    (line,) = [x for x in text.splitlines() if x.startswith("| during_training | 10 |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2:7] == [
        "0.01 (1.85 s, 17.0 s)", "43", "43", "12 (within W+2 = 12)", f"{1200 / 4300:.2f}"
    ]  # fmt: skip
    # the forecast's peaks: with retention fewer than without; measured / forecast in brackets
    kept, without = (int(c.split()[0]) for c in cells[7:9])
    assert kept < without
    assert cells[7:9] == [f"{kept} ({12 / kept:.2f})", f"{without} ({43 / without:.2f})"]
    assert "1 (without), 2 (with)" in text
    # a slot: the wait's end to the evaluate task's end, the median of every evaluation
    seed = rows[0]["kept"]["seeds"][0]
    slots = sorted(
        e["end_date"] - w["end_date"]
        for w, e in zip(seed["tasks"][::2], seed["tasks"][1::2], strict=True)
    )
    assert (
        "- during_training W=10 at 0.01: a slot held per evaluation (a wait's end to its "
        f"evaluate task's end) {sum(slots) / 2:.1f} s (median) (more than W steps), W steps "
        "18.5 s, an evaluation 17.0 s; an evaluation's end to its checkpoint's deletion 0.4 s "
        "(median)"
    ) in text
    assert "the median from an evaluation's end to its checkpoint's deletion" in text
    (line,) = [x for x in text.splitlines() if x.startswith("| during_training | 3 |")]
    assert [c.strip() for c in line.strip("|").split("|")][2] == "0.1 (18.50 s, 170.0 s)"
    assert "W=3 at 0.1: a slot held per evaluation" in text
    assert "an evaluation's end to its checkpoint's deletion (none ran)" in text
    assert "machine model calibrated once, on the first configuration's run" in text
