"""The convergence plot: its data from run folders built by the real writers, and the images."""

import io
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image
from synthetic_run import make_run, write_eval

from rcpflow.finalize import finalize
from rcpflow.status import run_status
from tasks.convergence import ConvergenceData, convergence_data, image_format, render, seed_curve

REPO = Path(__file__).resolve().parents[2]


def _submission(root: Path):
    """Three seeds at gbs 256 (reference RCP: step 18): seed 1 passes at 20, seed 2 at 19 with
    one speculative step evaluated after it, seed 3 has an invalid summary at 19 and nothing
    evaluated after it."""
    runs = {
        1: make_run(str(root / "seed_1"), seed=1, accuracies={18: 0.5, 19: 0.6, 20: 0.72}),
        2: make_run(str(root / "seed_2"), seed=2, accuracies={18: 0.3, 19: 0.71, 20: 0.8}),
        3: make_run(str(root / "seed_3"), seed=3, accuracies={18: 0.4}),
    }
    write_eval(runs[3], 19, 0.9, fatal_error="evaluator crashed")
    return runs


def _data(runs, gbs: int | None = 256) -> ConvergenceData:
    curves = [seed_curve(seed, run_status(run.run_dir)) for seed, run in runs.items()]
    return convergence_data("s", curves, gbs)


def test_plot_data_follows_the_runs(tmp_path: Path) -> None:
    runs = _submission(tmp_path)
    data = _data(runs)
    assert (data.global_batch_size, data.target) == (256, 0.69)
    assert data.reference is not None and data.reference.step == 18
    one, two, three = data.curves
    assert [s for s, _ in one.points] == [18, 19, 20] and one.passing_step == 20
    assert one.skipped == (21, 22, 23, 24) and one.invalid == () and one.not_evaluated == ()
    assert [round(v, 3) for _, v in one.points] == [0.502, 0.602, 0.721]
    # a score after the passing step stays a point (it was evaluated), the rest are skipped
    assert [s for s, _ in two.points] == [18, 19, 20] and two.passing_step == 19
    assert two.skipped == (21, 22, 23, 24)
    # an invalid summary is never a score, and without a pass nothing is skipped
    assert [s for s, _ in three.points] == [18] and three.passing_step is None
    assert three.invalid == (19,) and three.not_evaluated == (20, 21, 22, 23, 24)
    assert three.skipped == ()


def test_finalized_run_and_toy_batch_without_reference(tmp_path: Path) -> None:
    run = make_run(
        str(tmp_path / "r"), global_batch_size=16, max_steps=4, val_start_at=2,
        division="open", accuracies={2: 0.2, 3: 0.3, 4: 0.4},
    )  # fmt: skip
    assert finalize(run.run_dir).status == "aborted"
    data = _data({1: run}, gbs=16)
    assert data.reference is None
    assert data.reference_note == "no reference RCP for global_batch_size 16"
    (curve,) = data.curves
    assert curve.passing_step is None and [s for s, _ in curve.points] == [2, 3, 4]


@pytest.mark.parametrize("size", [(960, 540), (640, 480)])
def test_png_has_the_requested_size_and_is_reproducible(tmp_path: Path, size) -> None:
    runs = _submission(tmp_path)
    data = _data(runs)
    png = render(data, "png", size)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert Image.open(io.BytesIO(png)).size == size
    assert render(data, "png", size) == png


def test_svg_is_xml_with_the_target_and_reproducible(tmp_path: Path) -> None:
    runs = _submission(tmp_path)
    data = _data(runs)
    svg = render(data, "svg")
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and root.attrib["viewBox"] == "0 0 691.2 388.8"  # 960x540 px
    assert b"target &gt; 0.69" in svg and b"passes at step 20" in svg
    assert render(data, "svg") == svg
    with pytest.raises(ValueError, match="png, svg"):
        image_format("gif")


def test_importing_the_plot_module_loads_no_matplotlib() -> None:
    probe = "import sys, tasks.convergence; print('matplotlib' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "False"
