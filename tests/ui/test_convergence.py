"""The convergence plot: its data from run folders built by the real writers, and the images."""

import io
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

from devtools.synthetic_run import T0, make_run, write_eval
from rcpflow.cli.status import run_status
from rcpflow.verdict.finalize import finalize
from tasks.views.convergence import (
    ConvergenceData,
    convergence_data,
    image_format,
    plot_view,
    render,
    seed_curve,
    tracked_training,
    trainer_points,
    y_limits,
)

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
    curves = [
        seed_curve(f"seed {seed}", seed, run_status(run.run_dir)) for seed, run in runs.items()
    ]
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
    probe = "import sys, tasks.views.convergence; print('matplotlib' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "False"


def _svg_marks(svg: bytes, gid: str) -> list[tuple[float, float]]:
    """(x, y) in SVG coordinates of every marker of the mark group `gid`."""
    root = ET.fromstring(svg)
    (group,) = [g for g in root.iter() if g.attrib.get("id") == gid]
    return [(float(u.attrib["x"]), float(u.attrib["y"])) for u in group.iter() if "x" in u.attrib]


def test_skipped_steps_are_marks_on_the_step_axis_not_scores(tmp_path: Path) -> None:
    runs = _submission(tmp_path)
    data = _data({1: runs[1]})
    lo, hi = y_limits(data)
    assert lo >= 0.0 and lo < 0.502 and hi > 0.721 and lo < data.target < hi
    assert hi - lo < 0.5  # fitted to the data, not the whole 0..1
    svg = render(data, "svg")
    skipped = _svg_marks(svg, "skipped-0")
    assert len(skipped) == len(data.curves[0].skipped) == 4
    scores = _svg_marks(svg, "pass4-0")
    assert len(scores) == 3
    # every skipped mark sits below every score (SVG y grows downwards), along the axis
    assert min(y for _, y in skipped) > max(y for _, y in scores)
    assert len({y for _, y in skipped}) == 1
    assert b"seed 1: skipped, steps 21-24" in svg


def test_the_time_view_puts_minutes_from_run_start_on_the_x_axis(tmp_path: Path) -> None:
    run = make_run(str(tmp_path / "r"), accuracies={18: 0.5, 19: 0.8})
    status = run_status(run.run_dir)
    run_start = T0 + 60_000  # synthetic_run's run_start
    curve = seed_curve("seed 1", 1, status, run_start)
    assert curve.minutes(18) == (run.row(18).timestamp_ms - run_start) / 60_000
    data = convergence_data("t", [curve], 256)
    svg = render(data, "svg", view="time")
    assert b"minutes from run_start" in svg
    by_step, by_time = _svg_marks(render(data, "svg"), "pass4-0"), _svg_marks(svg, "pass4-0")
    assert len(by_step) == len(by_time) == 2
    with pytest.raises(ValueError, match="step, time"):
        plot_view("wall")


def test_training_reward_and_loss_come_from_the_trainers_lines() -> None:
    lines = [
        "not json",
        '{"event": "train seed 1 | {\\"loss\\": 0.5, \\"mean_reward\\": 0.25, \\"step\\": 1, '
        '\\"timestamp_ms\\": 1700000061000}", "level": "info"}',
        'train seed 1 | {"step": 2, "mean_reward": 0.5, "loss": 0.25, "timestamp_ms": 1}',
        '{"step": 2, "mean_reward": 0.75, "timestamp_ms": 2}',  # a resumed trainer: last wins
        '{"event": "stop_requested", "step": 2}',
        '{"step": 3, "mean_reward": NaN}',
    ]
    points = trainer_points(lines)
    assert [(p.step, p.reward, p.loss) for p in points] == [(1, 0.25, 0.5), (2, 0.75, None)]
    assert points[0].timestamp_ms == 1700000061000


def test_training_stats_of_the_mllog_are_plotted_beneath(tmp_path: Path) -> None:
    from rcpflow.records.mllog import Event

    events = [
        Event(
            "tracked_stats", {"reward": 0.3, "loss": 1.0}, T0 + 61_000, "POINT_IN_TIME", {"step": 1}
        ),
        Event(
            "tracked_stats", {"validation_time": 12.0}, T0, "POINT_IN_TIME", {"samples_count": 256}
        ),
    ]
    training = tracked_training(events)
    assert [(p.step, p.reward, p.loss) for p in training] == [(1, 0.3, 1.0)]
    run = make_run(str(tmp_path / "r"), accuracies={18: 0.5})
    curve = seed_curve("seed 1", 1, run_status(run.run_dir), T0 + 60_000, training)
    svg = render(convergence_data("t", [curve], 256), "svg")
    assert b'id="reward-0"' in svg and b'id="loss-0"' in svg and b"training reward" in svg


def test_several_runs_share_one_plot(tmp_path: Path) -> None:
    runs = _submission(tmp_path)
    svg = render(_data(runs), "svg")
    for i in range(3):
        assert f'id="pass4-{i}"'.encode() in svg
    assert b"seed 3: invalid summary, steps 19" in svg
