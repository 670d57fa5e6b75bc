"""``rcpflow forecast``'s command line: its flags, the request they make (every value bounded and
checked, each bad one a usage line naming its flag), the report and its text. The simulation
itself, its bounds and `recommend` are `rcpflow.planning.forecast`'s.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple, TypeVar

from rcpflow import recipe
from rcpflow.planning.forecast import (
    BATCH_MAX,
    NAMED_SCHEDULES,
    STEPS_MAX,
    WORK_MAX,
    Forecast,
    ForecastUsageError,
    Scenario,
    Schedule,
    recommend,
    recommend_cost,
    simulate,
)
from rcpflow.planning.rehearsal import JobProfile, RehearsalInputError, load_profile
from rcpflow.planning.storage_forecast import (
    CheckpointSizes,
    checked_lag,
    sizes_from_model,
    storage,
)
from rcpflow.verdict.schedule import SCHEDULES


@dataclass(frozen=True)
class Request:
    """What ``rcpflow forecast`` was asked: one scenario per schedule, W and passing step."""

    base: Scenario
    schedules: tuple[Schedule, ...]
    windows: tuple[int, ...]
    passing_steps: tuple[int, ...]
    recommend: bool
    sizes: CheckpointSizes | None = None  # given: the storage report too
    retention_lag_s: float = 0.0  # the storage report's: each deletion this long after allowed

    def scenarios(self) -> list[Scenario]:
        return [
            replace(self.base, schedule=schedule, window=w, passing_step=p)
            for schedule in self.schedules
            for w in ((1,) if schedule == "reference" else self.windows)
            for p in self.passing_steps
        ]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``rcpflow forecast``. Values are read as text and checked by
    `request_from`, so that each bad one is one usage line naming its flag."""
    flags = [
        ("--profile", "a job profile TOML (rcpflow.planning.rehearsal): default seconds and chips"),
        ("--step-seconds", "one training step (update and checkpoint save)"),
        ("--eval-seconds", "one evaluation of a checkpoint"),
        ("--train-chips", "chips of the training job"),
        ("--eval-chips", "chips of one evaluation (all its workers)"),
        ("--global-batch-size", "sets the default --val-start-at (the recipe's; default 256)"),
        ("--val-start-at", "first evaluated step (default: the recipe's)"),
        ("--max-steps", "the run's max_steps"),
        ("--passing-step", "the first step above the target: N, A-B or N,M,..."),
        (
            "--schedule",
            "after_training, during_training, both (default), reference (NeMo-RL's own: after "
            "training in its allocation, W = 1), all, or a comma-separated list",
        ),
        ("--window", "evaluations at once, W: N, A-B or N,M,... (default 1)"),
        ("--task-start-seconds", "a task's start latency in the scheduler (default 0)"),
        ("--poll-seconds", "how often a waiting step reads the manifest (default 0: at once)"),
        ("--resume-starts", "1: an evaluate resumes in a second task when its job ends (0)"),
        ("--cores", "the orchestrating machine's cores: models its load (default 0: none)"),
        ("--task-cpu-seconds", "with --cores: a task start's CPU seconds (default 0)"),
        ("--job-cpu-seconds", "with --cores: an evaluation job's CPU seconds beside it (0)"),
        ("--background-processes", "with --cores: other work's runnable processes (0)"),
        ("--concurrent-runs", "with --cores: runs sharing the machine, e.g. seeds (1)"),
        ("--weights-tb", "one checkpoint's weights in TB: adds the checkpoint storage report"),
        ("--full-state-tb", "the training state a full-state save adds, in TB (default 0)"),
        ("--model-params-b", "the model's parameters in billions, instead of the two sizes"),
        ("--full-state-every", "every K-th checkpoint from the validation start is full (1)"),
        ("--retention-lag-s", "with the sizes: each deletion this long after it is allowed (0)"),
    ]
    defaults = {
        "--global-batch-size": "256",
        "--schedule": "both",
        "--window": "1",
        "--task-start-seconds": "0",
        "--poll-seconds": "0",
    }
    for flag, text in flags:
        p.add_argument(flag, default=defaults.get(flag), help=text)
    switches = [
        ("--no-cancel", "higher steps' evaluations running at the pass run to their end"),
        ("--recommend", "per schedule, the smallest W within 10%% of the best time"),
        ("--each", "with several passing steps: a row per step, not only min/mean/max"),
        ("--json", "the same as JSON"),
    ]
    for flag, text in switches:
        p.add_argument(flag, action="store_true", help=text)


_N = TypeVar("_N", int, float)


def _parsed(flag: str, text: str | None, default: _N | None, parse: type[_N], noun: str) -> _N:
    """`text` as `parse` reads it; None: `default` (a profile's), else the flag is required."""
    if text is None and default is not None:
        return default
    if text is None:
        raise ForecastUsageError(f"{flag} is required (or give --profile)")
    try:
        if not _whole(text):
            raise ValueError
        return parse(text)
    except ValueError:
        raise ForecastUsageError(f"{flag} {text!r} is not {noun}") from None


def _whole(text: str) -> bool:
    """Whether `text` is a value as written, whole: no space around or inside it and no ``_``
    (Python's int and float would take ``' 5'`` and ``'1_0'``; names and numbers match whole
    here, as everywhere else)."""
    return bool(text) and not any(c.isspace() or c == "_" for c in text)


def _number(flag: str, text: str | None, default: float | None = None) -> float:
    value = _parsed(flag, text, default, float, "a number")
    if text is not None and not math.isfinite(value):
        raise ForecastUsageError(f"{flag} {text!r} is not a finite number")
    return value


def _integer(flag: str, text: str | None, default: int | None = None, most: int = 0) -> int:
    value = _parsed(flag, text, default, int, "an integer")
    if most and not 1 <= value <= most:
        raise ForecastUsageError(f"{flag} {value} must be in 1..{most}")
    return value


def parse_steps(flag: str, text: str | None) -> tuple[int, ...]:
    """``N``, ``A-B`` (inclusive) or a comma list of those, ascending without repeats; each in
    1..`STEPS_MAX` (checked before a range is expanded)."""
    if text is None:
        raise ForecastUsageError(f"{flag} is required")
    if len(text) > 10_000:
        raise ForecastUsageError(f"{flag}: {len(text)} characters, more than any list of steps")
    found: list[int] = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        try:
            if not (_whole(low) and (_whole(high) or not dash)):
                raise ValueError
            a = int(low)
            b = int(high) if dash else a
        except ValueError:
            raise ForecastUsageError(
                f"{flag} {text[:80]!r}: {part[:40]!r} is not N or A-B"
            ) from None
        if b < a:
            raise ForecastUsageError(f"{flag} {text[:80]!r}: {part[:40]!r} is an empty range")
        if b > STEPS_MAX:  # below 1: the scenario names it
            raise ForecastUsageError(f"{flag} {part[:40]!r}: at most {STEPS_MAX}")
        found += range(a, b + 1)
        if len(found) > STEPS_MAX:
            raise ForecastUsageError(f"{flag}: more than {STEPS_MAX} values")
    if len(set(found)) != len(found):
        raise ForecastUsageError(f"{flag} {text!r} names a step twice")
    return tuple(sorted(found))


def request_from(args: argparse.Namespace) -> Request:
    """The request the parsed flags make; ForecastUsageError naming the flag otherwise."""
    profile: JobProfile | None = None
    if args.profile is not None:
        try:
            profile = load_profile(args.profile)
        except (RehearsalInputError, OSError) as e:
            raise ForecastUsageError(f"--profile {args.profile}: {e}") from None

    step_s = _number(
        "--step-seconds", args.step_seconds, None if profile is None else profile.step_seconds
    )
    eval_s = _number(
        "--eval-seconds", args.eval_seconds, None if profile is None else profile.eval_seconds
    )
    train_chips = _integer(
        "--train-chips", args.train_chips, None if profile is None else profile.train_chips
    )
    eval_chips = _integer(
        "--eval-chips", args.eval_chips, None if profile is None else profile.eval_chips
    )
    max_steps = _integer("--max-steps", args.max_steps)
    if args.val_start_at is None:
        gbs = _integer("--global-batch-size", args.global_batch_size, most=BATCH_MAX)
        try:
            val_start = recipe.val_start_at(gbs)
        except ValueError as e:
            raise ForecastUsageError(f"--global-batch-size {gbs}: {e}") from None
    else:
        val_start = _integer("--val-start-at", args.val_start_at)
    passing = parse_steps("--passing-step", args.passing_step)
    windows = parse_steps("--window", args.window)
    schedules = _schedules(args.schedule)
    base = Scenario(
        step_seconds=step_s,
        eval_seconds=eval_s,
        val_start_at=val_start,
        max_steps=max_steps,
        passing_step=passing[0],
        schedule=schedules[0],
        window=windows[0],
        train_chips=train_chips,
        eval_chips=eval_chips,
        task_start_seconds=_number("--task-start-seconds", args.task_start_seconds),
        poll_seconds=_number("--poll-seconds", args.poll_seconds),
        cancel=not args.no_cancel,
        resume_starts=_integer("--resume-starts", args.resume_starts, 0),
        task_cpu_seconds=_number("--task-cpu-seconds", args.task_cpu_seconds, 0.0),
        job_cpu_seconds=_number("--job-cpu-seconds", args.job_cpu_seconds, 0.0),
        cores=_integer("--cores", args.cores, 0),
        background_processes=_number("--background-processes", args.background_processes, 0.0),
        concurrent_runs=_integer("--concurrent-runs", args.concurrent_runs, 1),
    )
    sizes = _sizes(args)
    request = Request(base, schedules, windows, passing, args.recommend, sizes, _lag(args, sizes))
    evaluated = max_steps - val_start + 1
    work = len(schedules) * len(windows) * len(passing) * (evaluated + 100)
    work += recommend_cost(base, passing) if args.recommend else 0
    if work > WORK_MAX:
        raise ForecastUsageError(
            f"--window x --passing-step{' x --recommend' if args.recommend else ''}: "
            f"{work} simulated steps ({len(schedules)} schedules, {len(windows)} W, "
            f"{len(passing)} passing steps, {evaluated} evaluated steps) is more than the "
            f"forecast's bound {WORK_MAX}: give fewer W, passing steps or --max-steps"
        )
    request.scenarios()  # every combination is checked (Scenario's own checks), not only one
    return request


def _sizes(args: argparse.Namespace) -> CheckpointSizes | None:
    """The checkpoint sizes the flags give (a model size or the sizes, not both), or None."""
    every = _integer("--full-state-every", args.full_state_every, 1, most=STEPS_MAX)
    if args.model_params_b is not None:
        if args.weights_tb is not None or args.full_state_tb is not None:
            raise ForecastUsageError(
                "--model-params-b: give it or --weights-tb/--full-state-tb, not both"
            )
        return sizes_from_model(_number("--model-params-b", args.model_params_b), every)
    if args.weights_tb is None:
        if args.full_state_tb is not None:
            raise ForecastUsageError("--full-state-tb needs --weights-tb")
        return None
    weights = _number("--weights-tb", args.weights_tb)
    return CheckpointSizes(weights, _number("--full-state-tb", args.full_state_tb, 0.0), every)


def _lag(args: argparse.Namespace, sizes: CheckpointSizes | None) -> float:
    """--retention-lag-s: bounded (`checked_lag`), and only with the sizes it is about."""
    if args.retention_lag_s is not None and sizes is None:
        raise ForecastUsageError("--retention-lag-s needs --weights-tb or --model-params-b")
    return checked_lag(_number("--retention-lag-s", args.retention_lag_s, 0.0))


def _schedules(text: str) -> tuple[Schedule, ...]:
    """--schedule: both, all, one name, or names separated by commas (no spaces)."""
    named: dict[str, tuple[Schedule, ...]] = {"both": SCHEDULES, "all": NAMED_SCHEDULES}
    named.update({s: (s,) for s in NAMED_SCHEDULES})
    found: list[Schedule] = []
    for part in text.split(","):
        if part not in named:  # whole: ' both' is not both
            raise ForecastUsageError(
                f"--schedule {text!r}: one of {', '.join(NAMED_SCHEDULES)}, both or all "
                "(names match whole: no spaces)"
            )
        found += [s for s in named[part] if s not in found]
    return tuple(found)


class Spread(NamedTuple):
    """min / mean / max of one figure over the passing steps."""

    low: float
    mean: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        v = list(values)
        return cls(min(v), statistics.fmean(v), max(v))


def _group(forecasts: Sequence[Forecast]) -> dict[tuple[Schedule, int], list[Forecast]]:
    groups: dict[tuple[Schedule, int], list[Forecast]] = {}
    for f in forecasts:
        groups.setdefault((f.scenario.schedule, f.scenario.window), []).append(f)
    return groups


def report(request: Request) -> dict[str, Any]:
    """Everything the command prints, as JSON-able data."""
    forecasts = [simulate(s) for s in request.scenarios()]
    summary = []
    for (schedule, window), group in _group(forecasts).items():
        figures = {
            "verdict_h": Spread.of(f.verdict_s / 3600 for f in group),
            "verdict_ratio": Spread.of(f.verdict_ratio for f in group),
            "eval_chip_hours": Spread.of(f.eval_chip_hours for f in group),
            "train_chip_hours": Spread.of(f.train_chip_hours for f in group),
            "wasted": Spread.of(f.wasted for f in group),
        }
        summary.append(
            {"schedule": schedule, "window": window, **{k: v._asdict() for k, v in figures.items()}}
        )
    out: dict[str, Any] = {
        "forecasts": [f.to_dict() for f in forecasts],
        "summary": summary,
    }
    if request.sizes is not None:
        out["storage"] = _storage_report(forecasts, request.sizes, request.retention_lag_s)
    if request.recommend:
        out["recommend"] = [
            recommend(request.base, request.passing_steps, s).to_dict() for s in SCHEDULES
        ]
    return out


def _storage_report(
    forecasts: Sequence[Forecast], sizes: CheckpointSizes, lag_s: float
) -> dict[str, Any]:
    """Per forecast, and the mean per schedule and W, the storage with and without retention
    (with it: each deletion `lag_s` after the rule allows it)."""
    rows = []
    for f in forecasts:
        sc = f.scenario
        rows.append(
            {
                "schedule": sc.schedule,
                "window": sc.window,
                "passing_step": sc.passing_step,
                "without": asdict(storage(f, sizes, retention=False)),
                "with": asdict(storage(f, sizes, retention=True, lag_s=lag_s)),
            }
        )
    means = []
    for (schedule, window), group in _group_rows(rows).items():
        mean = {
            side: {k: statistics.fmean(r[side][k] for r in group) for k in group[0][side]}
            for side in ("without", "with")
        }
        means.append({"schedule": schedule, "window": window, "passing_step": "mean", **mean})
    return {"sizes": asdict(sizes), "retention_lag_s": lag_s, "forecasts": rows, "summary": means}


def _group_rows(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["schedule"], r["window"]), []).append(r)
    return groups


STORAGE_HEADER = (
    "schedule", "W", "pass", "peak TB", "with retention", "ratio", "peak ckpts", "with",
    "TB-h", "with", "written TB",
)  # fmt: skip


def _key_cells(r: dict[str, Any]) -> list[str]:
    return [r["schedule"], str(r["window"]), str(r["passing_step"])]


def _storage_cells(r: dict[str, Any]) -> list[str]:
    off, on = r["without"], r["with"]
    ratio = on["peak_tb"] / off["peak_tb"] if off["peak_tb"] else 1.0
    figures = (
        (off["peak_tb"], ".1f"), (on["peak_tb"], ".1f"), (ratio, ".2f"),
        (off["peak_checkpoints"], "g"), (on["peak_checkpoints"], "g"),
        (off["tb_hours"], ".0f"), (on["tb_hours"], ".0f"), (off["written_tb"], ".1f"),
    )  # fmt: skip
    return [*_key_cells(r), *(format(v, fmt) for v, fmt in figures)]


def _storage_lines(request: Request, data: dict[str, Any], each: bool) -> list[str]:
    z = data["storage"]["sizes"]
    lag = data["storage"]["retention_lag_s"]
    when = (
        f"as the rule allows (--while-training --settled), each deletion {lag:g} s after "
        "(--retention-lag-s)"
        if lag
        else "as the rule allows at the earliest (--while-training --settled)"
    )
    lines = [
        f"checkpoint storage: {z['weights_tb']:g} TB weights a step, a full state "
        f"({z['full_state_tb']:g} TB more) every {z['full_every']} steps; retention {when}; "
        "TB-h up to the run's end"
    ]
    several = len(request.passing_steps) > 1
    rows = data["storage"]["forecasts"] if each or not several else data["storage"]["summary"]
    return lines + _table([STORAGE_HEADER, *(_storage_cells(r) for r in rows)])


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


HEADER = (
    "schedule", "W", "pass", "verdict (h)", "ratio", "steps", "evals", "wasted",
    "eval chip-h", "train chip-h",
)  # fmt: skip


def _forecast_cells(f: dict[str, Any]) -> list[str]:
    return [
        f["schedule"],
        str(f["window"]),
        str(f["passing_step"]),
        f"{f['verdict_h']:.2f}",
        f"{f['verdict_ratio']:.2f}",
        str(f["steps_trained"]),
        str(f["evaluations"]),
        str(f["wasted"]),
        f"{f['eval_chip_hours']:.1f}",
        f"{f['train_chip_hours']:.1f}",
    ]


def _summary_cells(s: dict[str, Any]) -> list[str]:
    def spread(key: str, fmt: str) -> str:
        return "/".join(format(s[key][k], fmt) for k in ("low", "mean", "high"))

    return [
        s["schedule"],
        str(s["window"]),
        "all",
        spread("verdict_h", ".2f"),
        spread("verdict_ratio", ".2f"),
        "",
        "",
        spread("wasted", ".1f"),
        spread("eval_chip_hours", ".0f"),
        spread("train_chip_hours", ".0f"),
    ]


def render_text(request: Request, data: dict[str, Any], each: bool) -> str:
    b = request.base
    cancel = "cancelled at the pass" if b.cancel else "left running (--no-cancel)"
    lines = [
        f"forecast: step {b.step_seconds:g} s, evaluation {b.eval_seconds:g} s on "
        f"{b.eval_chips} chips, training on {b.train_chips} chips; steps "
        f"{b.val_start_at}..{b.max_steps} evaluated; task start {b.task_start_seconds:g} s, "
        f"poll {b.poll_seconds:g} s; higher steps' evaluations {cancel}; time from run_start",
    ]
    if b.resume_starts:
        lines.append("an evaluate resumes in a second task start when its job ends")
    if b.cores:
        lines.append(
            f"machine: {b.cores} cores, a task start +{b.task_cpu_seconds:g} CPU s, a job "
            f"+{b.job_cpu_seconds:g} CPU s, stretched by {b.background_processes:g} background "
            f"processes and {b.concurrent_runs} run(s)' task starts in flight"
        )
    several = len(request.passing_steps) > 1
    if each or not several:
        lines += _table([HEADER, *(_forecast_cells(f) for f in data["forecasts"])])
    if several:
        steps = request.passing_steps
        lines.append(f"min/mean/max over passing steps {steps[0]}..{steps[-1]}:")
        lines += _table([HEADER, *(_summary_cells(s) for s in data["summary"])])
    if request.sizes is not None:
        lines += _storage_lines(request, data, each)
    for r in data["recommend"] if request.recommend else []:
        lines.append(
            f"recommend {r['schedule']}: W = {r['window']} (verdict {r['verdict_s'] / 3600:.2f} h,"
            f" {r['eval_chip_hours']:.1f} evaluation chip-h; the best, W = {r['best_window']}, "
            f"{r['best_verdict_s'] / 3600:.2f} h)"
        )
    return "\n".join(lines) + "\n"
