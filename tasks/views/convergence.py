"""The convergence plot: pass@4 of each run against the 0.69 target, by step or by wall clock,
with the training reward (and loss) beneath it when the trainer logged them.

Drawn from what `rcpflow.cli.status` says about each run (which steps have a valid summary and
their pass@4, which one the gate found passing, which it skips), each checkpoint's weight-update
time and the MLLOG's ``run_start`` (the wall-clock view: minutes from ``run_start``), the
training stats (`tracked_training` from the MLLOG, `trainer_points` from the trainer's own JSON
lines) and the official RCP file (where the reference runs converged at this batch size). Steps
without a score are marked on the step axis itself, one row of marks per run, never as values:
skipped (a lower step passed), invalid summary, or not evaluated yet. The y-axis is fitted to
the scores with the target in view. Several runs (a submission's seeds, or runs picked to
compare) share one plot, one colour each. Every mark group carries an SVG id
(``skipped-<i>``, ``invalid-<i>``, ``not-evaluated-<i>``, ``pass4-<i>``, ``reward-<i>``, ``target``)
so a reader can find it. PNG or SVG, of exactly the requested pixel size.

matplotlib is imported only when drawing (never by a DAG parse or a plugin load), with the
object API and the Agg canvas: no pyplot state, safe in a threaded API server. The same data
gives the same bytes (fixed SVG hash salt, no date in the metadata).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rcpflow import recipe
from rcpflow.cli.status import RunStatus
from rcpflow.records.mllog import Event
from rcpflow.records.rcp_reference import RcpFileError, ReferencePoint, reference_point

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ImageFormat = Literal["png", "svg"]
FORMATS: tuple[ImageFormat, ...] = ("png", "svg")
PlotView = Literal["step", "time"]
VIEWS: tuple[PlotView, ...] = ("step", "time")
MEDIA_TYPES = {"png": "image/png", "svg": "image/svg+xml"}
DEFAULT_SIZE_PX = (960, 540)
_DPI = 100
_REWARD_KEYS = ("mean_reward", "reward")
# NeMo-RL logs its loss as `reduced_train_loss` in tracked_stats (rcpflow's trainers: `loss`).
_LOSS_KEYS = ("loss", "reduced_train_loss")


@dataclass(frozen=True)
class TrainingPoint:
    """One training update as the trainer reported it."""

    step: int
    reward: float | None
    loss: float | None
    timestamp_ms: int | None


@dataclass(frozen=True)
class SeedCurve:
    """One run's points: (step, pass@4) of its valid summaries, and the steps without one."""

    label: str  # "seed N" in a submission; the run's path when runs are compared
    seed: int
    points: tuple[tuple[int, float], ...]
    passing_step: int | None
    skipped: tuple[int, ...]  # the gate skips them: a lower step passed
    invalid: tuple[int, ...]  # a summary exists but is not valid
    not_evaluated: tuple[int, ...]
    step_times_ms: tuple[tuple[int, int], ...] = ()  # (step, weight update ms) of every row
    run_start_ms: int | None = None
    training: tuple[TrainingPoint, ...] = ()

    def minutes(self, step: int) -> float | None:
        """Minutes from run_start to the weight update of `step`'s checkpoint."""
        times = dict(self.step_times_ms)
        if self.run_start_ms is None or step not in times:
            return None
        return (times[step] - self.run_start_ms) / 60_000


@dataclass(frozen=True)
class ConvergenceData:
    title: str
    global_batch_size: int | None
    target: float
    reference: ReferencePoint | None
    curves: tuple[SeedCurve, ...]

    @property
    def reference_note(self) -> str:
        if self.global_batch_size is None:
            return "no reference: no manifest rows, or runs of different batch sizes"
        if self.reference is None:
            return f"no reference RCP for global_batch_size {self.global_batch_size}"
        r = self.reference
        how = "interpolated RCP" if r.interpolated else "reference RCP"
        return f"{how}: {r.samples_to_converge:.0f} samples (step {r.step:g})"


def image_format(name: str) -> ImageFormat:
    for fmt in FORMATS:
        if name == fmt:
            return fmt
    raise ValueError(f"image format must be one of {', '.join(FORMATS)}, got {name!r}")


def plot_view(name: str) -> PlotView:
    for view in VIEWS:
        if name == view:
            return view
    raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {name!r}")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _training_point(record: Any, step: Any, timestamp_ms: Any) -> TrainingPoint | None:
    if not isinstance(record, dict) or isinstance(step, bool) or not isinstance(step, int):
        return None
    reward = next((_number(record[k]) for k in _REWARD_KEYS if k in record), None)
    loss = next((_number(record[k]) for k in _LOSS_KEYS if k in record), None)
    if reward is None and loss is None:
        return None
    is_ms = isinstance(timestamp_ms, int) and not isinstance(timestamp_ms, bool)
    return TrainingPoint(step, reward, loss, timestamp_ms if is_ms else None)


def tracked_training(events: Sequence[Event]) -> tuple[TrainingPoint, ...]:
    """Training reward/loss from the MLLOG's ``tracked_stats`` events that carry them (value
    ``{"reward"|"mean_reward": x, "loss"|"reduced_train_loss": y}``, metadata ``step``); the
    eval section's ``validation_time`` stats carry neither and are not training points."""
    found: dict[int, TrainingPoint] = {}
    for e in events:
        if e.key == "tracked_stats":
            point = _training_point(e.value, e.metadata.get("step"), e.time_ms)
            if point is not None:
                found[point.step] = point
    return tuple(found[s] for s in sorted(found))


def trainer_points(lines: Iterable[str]) -> tuple[TrainingPoint, ...]:
    """Training reward/loss from the JSON lines the trainers print, one per update
    (``{"step", "mean_reward", "loss", "timestamp_ms"}``), wherever they sit in a log line
    (after a ``... | `` prefix, inside a log record's ``event``); the last word on a step wins
    (a resumed trainer repeats steps)."""
    found: dict[int, TrainingPoint] = {}
    for line in lines:
        text = line.strip()
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            text = record["event"]  # an Airflow log record: the trainer's line is its event
            record = None
        if record is None:
            brace = text.find("{")
            if brace < 0:
                continue
            try:
                record = json.loads(text[brace:])
            except ValueError:
                continue
        if isinstance(record, dict):
            point = _training_point(record, record.get("step"), record.get("timestamp_ms"))
            if point is not None:
                found[point.step] = point
    return tuple(found[s] for s in sorted(found))


def seed_curve(
    label: str,
    seed: int,
    status: RunStatus,
    run_start_ms: int | None = None,
    training: Sequence[TrainingPoint] = (),
) -> SeedCurve:
    steps = status.steps
    return SeedCurve(
        label=label,
        seed=seed,
        points=tuple((s.step, s.eval_accuracy) for s in steps if s.eval_accuracy is not None),
        passing_step=next((s.step for s in steps if s.gate == "passes"), None),
        skipped=tuple(s.step for s in steps if s.gate == "skip" and s.eval_accuracy is None),
        invalid=tuple(
            s.step for s in steps if s.summary in ("invalid", "unreadable") and s.gate != "skip"
        ),
        not_evaluated=tuple(s.step for s in steps if s.summary == "missing" and s.gate != "skip"),
        step_times_ms=tuple((s.step, s.timestamp_ms) for s in steps),
        run_start_ms=run_start_ms,
        training=tuple(training),
    )


def convergence_data(
    title: str,
    curves: Sequence[SeedCurve],
    global_batch_size: int | None,
    target: float = recipe.TARGET_ACCURACY,
) -> ConvergenceData:
    """The plot's data; the reference point is the official one for `global_batch_size`."""
    try:
        reference = None if global_batch_size is None else reference_point(global_batch_size)
    except RcpFileError:
        reference = None
    return ConvergenceData(
        title=title,
        global_batch_size=global_batch_size,
        target=target,
        reference=reference,
        curves=tuple(sorted(curves, key=lambda c: (c.seed, c.label))),
    )


def y_limits(data: ConvergenceData) -> tuple[float, float]:
    """The pass@4 axis: the scores and the target, with a margin, within 0..1."""
    values = [v for c in data.curves for _, v in c.points] + [data.target]
    lo, hi = min(values), max(values)
    pad = max(0.02, 0.08 * (hi - lo))
    return max(0.0, lo - pad), min(1.0, hi + pad)


def render(
    data: ConvergenceData,
    fmt: ImageFormat,
    size_px: tuple[int, int] = DEFAULT_SIZE_PX,
    view: PlotView = "step",
) -> bytes:
    """The plot as PNG or SVG bytes, `size_px` (width, height) pixels; `view` "time" puts
    minutes from run_start on the x-axis."""
    image_format(fmt)
    plot_view(view)
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = size_px
    fig = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    FigureCanvasAgg(fig)
    _draw(fig, data, view)
    out = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    with rc_context({"svg.hashsalt": "rcpflow"}):  # stable element ids: same data, same SVG
        fig.savefig(out, format=fmt, dpi=_DPI, metadata=metadata)
    return out.getvalue()


def _x(curve: SeedCurve, step: int, view: PlotView) -> float | None:
    return float(step) if view == "step" else curve.minutes(step)


def _xs(curve: SeedCurve, steps: Iterable[int], view: PlotView) -> list[float]:
    return [x for x in (_x(curve, s, view) for s in steps) if x is not None]


def _training_x(curve: SeedCurve, point: TrainingPoint, view: PlotView) -> float | None:
    if view == "step":
        return float(point.step)
    if curve.run_start_ms is not None and point.timestamp_ms is not None:
        return (point.timestamp_ms - curve.run_start_ms) / 60_000
    return curve.minutes(point.step)


def _draw(fig: Figure, data: ConvergenceData, view: PlotView) -> None:
    from matplotlib import rcParams
    from matplotlib.ticker import MaxNLocator

    has_training = any(c.training for c in data.curves)
    if has_training:
        ax, train_ax = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.3])
    else:
        ax, train_ax = fig.add_subplot(), None
    fig.subplots_adjust(left=0.08, right=0.68, top=0.92, bottom=0.12, hspace=0.08)
    colors = rcParams["axes.prop_cycle"].by_key()["color"]
    on_axis = ax.get_xaxis_transform()  # x in data, y in axes fractions: marks, not values
    for i, curve in enumerate(data.curves):
        color = colors[i % len(colors)]
        row = 0.03 + 0.045 * i  # each run's row of marks along the step axis
        placed = ((_x(curve, s, view), v) for s, v in curve.points)
        pts = [(x, v) for x, v in placed if x is not None]
        if pts:
            (line,) = ax.plot(*zip(*pts, strict=True), "o-", color=color, ms=4,
                              label=curve.label)  # fmt: skip
            line.set_gid(f"pass4-{i}")
        if curve.passing_step is not None:
            x = _x(curve, curve.passing_step, view)
            if x is not None:
                ax.plot(
                    [x], [dict(curve.points)[curve.passing_step]], marker="*", ms=16,
                    color=color, mec="black", ls="none",
                    label=f"{curve.label}: passes at step {curve.passing_step}",
                )  # fmt: skip
        for steps, marker, what, gid in (
            (curve.skipped, "|", "skipped", "skipped"),  # the legend is narrow: the page says why
            (curve.invalid, "X", "invalid summary", "invalid"),
            (curve.not_evaluated, "o", "not evaluated", "not-evaluated"),
        ):
            xs = _xs(curve, steps, view)
            if xs:
                (marks,) = ax.plot(
                    xs, [row] * len(xs), marker=marker, ls="none", color=color,
                    mfc="none" if marker == "o" else color, ms=8 if marker == "|" else 6,
                    mew=2 if marker == "|" else 1, alpha=0.8, transform=on_axis, clip_on=False,
                    label=f"{curve.label}: {what}, steps {_ranges(steps)}",
                )  # fmt: skip
                marks.set_gid(f"{gid}-{i}")
        if train_ax is not None and curve.training:
            _draw_training(train_ax, curve, view, color, i)
    target = ax.axhline(data.target, color="crimson", ls="--", lw=1.2,
                        label=f"target > {data.target}")  # fmt: skip
    target.set_gid("target")
    if data.reference is not None:
        ref_x = _reference_x(data, view)
        if ref_x is not None:
            ax.axvline(ref_x, color="grey", ls=":", lw=1.2, label=data.reference_note)
    ax.set_ylim(*y_limits(data))
    if view == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    xlabel = (
        "step (checkpoint after that many weight updates)"
        if view == "step"
        else "minutes from run_start (weight update of the checkpoint)"
    )
    (train_ax or ax).set_xlabel(xlabel)
    ax.set_ylabel("pass@4 (eval_accuracy)")
    ax.set_title(data.title, fontsize=11)
    if data.reference is None:
        ax.text(0.01, 0.97, data.reference_note, transform=ax.transAxes, va="top", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    if train_ax is not None:
        train_ax.set_ylabel("training", fontsize=8)
        train_ax.grid(True, alpha=0.3)
        train_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def _reference_x(data: ConvergenceData, view: PlotView) -> float | None:
    """Where the reference point sits: its step, or in the time view, the time of the first
    curve's checkpoint at that step (the reference has no time of its own)."""
    assert data.reference is not None
    if view == "step":
        return data.reference.step
    step = math.ceil(data.reference.step)
    for curve in data.curves:
        x = curve.minutes(step)
        if x is not None and len(data.curves) == 1:
            return x
    return None  # several runs: no one time stands for the reference step


# What `_draw_training` plots of each training update: value, line style, label, SVG id prefix.
_TRAINING_LINES: tuple[tuple[Callable[[TrainingPoint], float | None], str, str, str], ...] = (
    (lambda p: p.reward, "-", "training reward", "reward"),
    (lambda p: p.loss, ":", "loss", "loss"),
)


def _draw_training(ax: Axes, curve: SeedCurve, view: PlotView, color: str, i: int) -> None:
    for value_of, style, label, gid in _TRAINING_LINES:
        points = [(_training_x(curve, p, view), value_of(p)) for p in curve.training]
        points = [(x, v) for x, v in points if x is not None and v is not None]
        if points:
            (line,) = ax.plot(*zip(*points, strict=True), style, color=color, lw=1.2,
                              label=f"{curve.label}: {label}")  # fmt: skip
            line.set_gid(f"{gid}-{i}")


def _ranges(steps: Sequence[int]) -> str:
    """``18-20, 23`` for 18, 19, 20, 23."""
    parts: list[str] = []
    ordered = sorted(steps)
    start = prev = ordered[0]
    for s in [*ordered[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(parts)
