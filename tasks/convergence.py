"""The convergence plot: pass@4 by step for each seed against the 0.69 target.

Drawn from what `rcpflow.status` says about each run (which steps have a valid summary and
their pass@4, which one the gate found passing, which it skips) and from the official RCP file
(where the reference runs converged at this batch size). Steps without a valid summary are
drawn along the bottom, marked skipped (a lower step passed), invalid, or not evaluated yet, so
nothing missing looks like a low score. PNG or SVG, of exactly the requested pixel size.

matplotlib is imported only when drawing (never by a DAG parse or a plugin load), with the
object API and the Agg canvas: no pyplot state, safe in a threaded API server. The same data
gives the same bytes (fixed SVG hash salt, no date in the metadata).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rcpflow import recipe
from rcpflow.rcp_reference import RcpFileError, ReferencePoint, reference_point
from rcpflow.status import RunStatus

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ImageFormat = Literal["png", "svg"]
FORMATS: tuple[ImageFormat, ...] = ("png", "svg")
MEDIA_TYPES = {"png": "image/png", "svg": "image/svg+xml"}
DEFAULT_SIZE_PX = (960, 540)
_DPI = 100


@dataclass(frozen=True)
class SeedCurve:
    """One run's points: (step, pass@4) of its valid summaries, and the steps without one."""

    seed: int
    points: tuple[tuple[int, float], ...]
    passing_step: int | None
    skipped: tuple[int, ...]  # the gate skips them: a lower step passed
    invalid: tuple[int, ...]  # a summary exists but is not valid
    not_evaluated: tuple[int, ...]


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
            return "no reference: no manifest rows"
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


def seed_curve(seed: int, status: RunStatus) -> SeedCurve:
    steps = status.steps
    return SeedCurve(
        seed=seed,
        points=tuple((s.step, s.eval_accuracy) for s in steps if s.eval_accuracy is not None),
        passing_step=next((s.step for s in steps if s.gate == "passes"), None),
        skipped=tuple(s.step for s in steps if s.gate == "skip" and s.eval_accuracy is None),
        invalid=tuple(
            s.step for s in steps if s.summary in ("invalid", "unreadable") and s.gate != "skip"
        ),
        not_evaluated=tuple(s.step for s in steps if s.summary == "missing" and s.gate != "skip"),
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
        curves=tuple(sorted(curves, key=lambda c: c.seed)),
    )


def render(
    data: ConvergenceData, fmt: ImageFormat, size_px: tuple[int, int] = DEFAULT_SIZE_PX
) -> bytes:
    """The plot as PNG or SVG bytes, `size_px` (width, height) pixels."""
    image_format(fmt)
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = size_px
    fig = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    FigureCanvasAgg(fig)
    _draw(fig, data)
    out = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    with rc_context({"svg.hashsalt": "rcpflow"}):  # stable element ids: same data, same SVG
        fig.savefig(out, format=fmt, dpi=_DPI, metadata=metadata)
    return out.getvalue()


def _draw(fig: Figure, data: ConvergenceData) -> None:
    from matplotlib import rcParams
    from matplotlib.ticker import MaxNLocator

    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.08, right=0.7, top=0.9, bottom=0.12)
    colors = rcParams["axes.prop_cycle"].by_key()["color"]
    # Steps without a score are marked in a strip below 0, one row per seed.
    strip = 0.035
    for i, curve in enumerate(data.curves):
        color = colors[i % len(colors)]
        floor = -strip * (i + 1)
        if curve.points:
            steps, values = zip(*curve.points, strict=True)
            ax.plot(steps, values, "o-", color=color, ms=4, label=f"seed {curve.seed}")
        if curve.passing_step is not None:
            value = dict(curve.points)[curve.passing_step]
            ax.plot(
                [curve.passing_step], [value], marker="*", ms=16, color=color, mec="black",
                ls="none", label=f"seed {curve.seed}: passes at step {curve.passing_step}",
            )  # fmt: skip
        for steps, marker, what in (
            (curve.skipped, "x", "skipped"),
            (curve.invalid, "X", "invalid summary"),
            (curve.not_evaluated, "o", "not evaluated"),
        ):
            if steps:
                ax.plot(
                    steps, [floor] * len(steps), marker=marker, ls="none", color=color,
                    mfc="none" if marker == "o" else color, ms=6, alpha=0.7,
                    label=f"seed {curve.seed}: {what} ({len(steps)})",
                )  # fmt: skip
    ax.axhline(data.target, color="crimson", ls="--", lw=1.2, label=f"target > {data.target}")
    if data.reference is not None:
        ax.axvline(data.reference.step, color="grey", ls=":", lw=1.2, label=data.reference_note)
    ax.set_ylim(-strip * (len(data.curves) + 1), 1.0)
    ax.set_yticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step (checkpoint after that many weight updates)")
    ax.set_ylabel("pass@4 (eval_accuracy)")
    ax.set_title(data.title, fontsize=11)
    if data.reference is None:
        ax.text(0.01, 0.97, data.reference_note, transform=ax.transAxes, va="top", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
