"""The proportions section re-rendered from saved measurements (``--proportions-from``): what a
row saved reads back whole, and the forecast column is given by the model calibrated on the
first row (each row's own background, never its own verdict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from measured_rows import row

from devtools.bench import proportions_bench as pb
from devtools.bench import verdict_bench as vb


def test_a_saved_row_reads_back_whole_and_the_section_shows_both_forecasts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pb.os, "cpu_count", lambda: 2)
    # the first row's load changes between its evaluations: the calibration tells the CPU
    # seconds from the fixed ones; the second row runs on a busier machine, 6x slower
    rows = [row(1, (2, 8)), row(3, (12, 12))]
    saved = tmp_path / "proportions.json"
    saved.write_text(json.dumps([pb.saved_row(r) for r in rows]))
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n")
    assert vb.main(["--section", "proportions", "--proportions-from", str(saved),
                    "--output", str(out)]) == 0  # fmt: skip
    text = out.read_text()
    lines = [line for line in text.splitlines() if line.startswith("| after_training")]
    assert len(lines) == 2
    cells = [line.strip("|").split("|") for line in lines]
    background = [float(c[6]) for c in cells]
    assert background[0] < background[1]  # each row's own, measured
    one_start, machine = (
        [float(c[i].strip().rstrip("%")) for c in cells] for i in (7, 8)
    )  # fmt: skip
    # the busier row: one task start (the first row's) falls far short, the machine model
    # follows the load it measured
    assert one_start[1] < -30
    assert abs(machine[1]) <= 15
    fitted = "fitted on the first row's 6 evaluations' phases: a task start 0.00 s + 2.50 CPU s"
    assert fitted in text
    assert "Goals:" in text
    assert "- not in these measurements: after_training W=10, during_training W=1" in text
