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
