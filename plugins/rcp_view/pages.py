"""The RCP view's HTML: server-rendered pages, every value escaped.

The pages run inside the Airflow UI's iframe, which the UI sandboxes without top navigation:
a plain ``target=_top`` link into the UI (a DAG run's grid) would do nothing there. Such links
carry ``data-ui``, and the one script of the page hands them to the UI's own router (same
origin: push the path onto the top window's history and tell its router), so they open in
the UI around the frame; outside a frame they are ordinary links. Element ids and ``data-*``
attributes are stable: the browser test and anyone scripting against the page read them.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

from rcpflow import recipe
from rcpflow.cli.status import StepStatus
from rcpflow.submission.rcp_numbers import RcpNumbers
from tasks.names import RUN_DAG_ID
from tasks.results.verdicts import Verdict
from tasks.views.storage_index import Index, RunEntry, RunView, SubmissionEntry

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.2rem; color: #1a202c; }
h1 { font-size: 1.35rem; } h2 { font-size: 1.1rem; margin-top: 1.6rem; }
table { border-collapse: collapse; margin: 0.4rem 0; }
th, td { border: 1px solid #cbd5e0; padding: 0.25rem 0.55rem; text-align: left; font-size: 0.9rem; }
th { background: #edf2f7; }
tr.passed td { background: #c6f6d5; font-weight: 600; }
tr.skip td { color: #718096; }
.ok { color: #22543d; font-weight: 600; } .fail { color: #9b2c2c; font-weight: 600; }
.muted { color: #718096; } code { font-size: 0.85rem; }
img.plot { max-width: 100%; border: 1px solid #e2e8f0; }
ul.problems li { color: #9b2c2c; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


# Links into the Airflow UI, clicked inside the UI's iframe: navigate the UI, not the frame.
_SCRIPT = """
document.addEventListener("click", function (event) {
  var link = event.target.closest("a[data-ui]");
  if (!link || window.top === window) return;
  try {
    window.top.history.pushState(null, "", link.getAttribute("href"));
    window.top.dispatchEvent(new PopStateEvent("popstate", { state: null }));
    event.preventDefault();
  } catch (e) { /* not the UI's frame: let the link be a link */ }
});
"""


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}<script>{_SCRIPT}</script></body></html>\n"
    )


def _link(href: str, text: str, *, ui: bool = False, cls: str = "") -> str:
    target = " data-ui='1'" if ui else ""
    klass = f" class='{_e(cls)}'" if cls else ""
    return f"<a href='{_e(href)}'{target}{klass}>{_e(text)}</a>"


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms (not a date: out of range)"
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _problems(problems: Sequence[str]) -> str:
    """Files that could not be read, named, one per line (never a 500)."""
    if not problems:
        return ""
    items = "".join(f"<li>{_e(p)}</li>" for p in problems)
    return f"<h2>Could not read</h2><ul class='problems' id='problems'>{items}</ul>"


def _verdict(verdict: Verdict | None) -> str:
    if verdict is None:
        return "<span class='muted'>not run</span>"
    cls = "ok" if verdict.ok else "fail"
    return f"<span class='{cls}'>{_e(verdict.headline())}</span>"


def _overall(entry: SubmissionEntry) -> str:
    verdict = entry.verdict
    cls = {"PASS": "ok", "FAIL": "fail", "UNREADABLE": "fail"}.get(verdict, "muted")
    missing = sum(v is None for v in entry.all_verdicts)
    note = f" ({missing} checks not run yet)" if verdict == "PENDING" else ""
    return f"<span class='{cls}'>{_e(verdict + note)}</span>"


def _verdict_errors(verdict: Verdict | None) -> str:
    if verdict is None or verdict.ok or not verdict.errors:
        return ""
    return "<ul>" + "".join(f"<li><code>{_e(e)}</code></li>" for e in verdict.errors) + "</ul>"


def _grid(base: str, dag_id: str, run_id: str) -> str:
    return f"{base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def _q(route: str, **params: object) -> str:
    return f"{route}?{urlencode(params)}"


def run_outcome(run: RunView) -> str:
    """How the run ended, in the words of its MLLOG (the ``run_stop`` finalize wrote)."""
    return run.outcome


def _minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} min"


def _finalize_now(run: RunView) -> str:
    now = run.status.finalize
    if now is None:
        return "-"
    stop = f", run_stop at step {now.run_stop_step}" if now.run_stop_step is not None else ""
    return f"{now.status}{stop} ({now.reason})"


def _run_row(base: str, entry: RunEntry) -> str:
    run = entry.run
    passing = run.passing_step
    return (
        f"<tr data-seed='{entry.seed}'><td>{entry.seed}</td>"
        f"<td>{_link(_q('run', path=run.path), run.path)}</td>"
        f"<td class='outcome'>{_e(run.outcome)}</td>"
        f"<td>{_e(passing if passing is not None else '-')}</td>"
        f"<td class='ttt'>{_e(_minutes(run.minutes_to_train))}</td>"
        f"<td>{_verdict(run.compliance)}</td>"
        f"<td>{_link(_grid(base, entry.dag_id, entry.dag_run_id), entry.dag_run_id, ui=True)}"
        "</td></tr>"
    )


def _runs_table(base: str, runs: Sequence[RunEntry]) -> str:
    head = (
        "<tr><th>seed</th><th>run folder</th><th>outcome (MLLOG)</th><th>passing step</th>"
        "<th>time to train</th><th>compliance checker</th><th>DAG run (grid)</th></tr>"
    )
    return f"<table id='runs'>{head}{''.join(_run_row(base, r) for r in runs)}</table>"


def _verdicts_table(entry: SubmissionEntry) -> str:
    rows = "".join(
        f"<tr data-tool='{_e(tool)}'><td>{_e(tool)}</td><td>{_verdict(v)}{_verdict_errors(v)}"
        "</td></tr>"
        for tool, v in entry.verdicts
    )
    return f"<table id='checkers'><tr><th>checker</th><th>verdict</th></tr>{rows}</table>"


def _samples(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} samples"


def rcp_numbers_block(numbers: RcpNumbers | None, verdict: Verdict | None) -> str:
    """The RCP checker's numbers (`rcpflow.submission.rcp_numbers`) beside its persisted verdict."""
    if numbers is None:
        return (
            "<p id='rcp-numbers' class='muted'>RCP numbers: unknown (the runs have no one "
            "batch size, or no usable manifest)</p>"
        )
    per_seed = ", ".join(
        f"seed {seed}: {'did not converge' if v is None else f'{v} samples'}"
        for seed, v in numbers.samples
    )
    rows = [
        ("reference", numbers.record, "record"),
        ("reference mean", _samples(numbers.reference_mean), "reference-mean"),
        (
            "reference stdev",
            "-" if numbers.reference_stdev is None else f"{numbers.reference_stdev:.1f}",
            "reference-stdev",
        ),
        ("minimum allowed mean", _samples(numbers.min_allowed), "min-allowed"),
        ("samples to converge", per_seed, "samples"),
        (
            "seeds in the score (olympic)",
            ", ".join(map(str, numbers.scored_seeds))
            + (
                f" (dropped, fastest and slowest: {', '.join(map(str, numbers.dropped_seeds))})"
                if numbers.dropped_seeds
                else ""
            ),
            "scored-seeds",
        ),
        ("this submission's mean", _samples(numbers.submission_mean), "submission-mean"),
        ("why", numbers.reason, "why"),
    ]
    body = "".join(
        f"<tr data-rcp='{key}'><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v, key in rows
    )
    agrees = ""
    if verdict is not None and verdict.ok != numbers.passes:
        agrees = (
            "<p class='fail'>The checker's verdict differs from these numbers: its own words "
            "above are the verdict.</p>"
        )
    return f"<table id='rcp-numbers'>{body}</table>{agrees}"


def _dag_run_link(base: str, dag_run_id: str | None) -> str:
    if dag_run_id is None:
        return "<span class='muted'>none known</span>"
    return _link(_grid(base, RUN_DAG_ID, dag_run_id), dag_run_id, ui=True)


def _runs_list(runs: Sequence[RunView], dag_runs: Mapping[str, str | None], base: str) -> str:
    rows = "".join(
        f"<tr data-run='{_e(r.path)}'><td><input type='checkbox' name='path' "
        f"value='{_e(r.path)}'></td><td>{_link(_q('run', path=r.path), r.path)}</td>"
        f"<td class='outcome'>{_e(r.outcome)}</td>"
        f"<td class='ttt'>{_e(_minutes(r.minutes_to_train))}</td>"
        f"<td>{_verdict(r.compliance)}</td><td>{_dag_run_link(base, dag_runs.get(r.path))}</td>"
        "</tr>"
        for r in runs
    )
    return (
        "<form id='compare-form' action='compare' method='get'><table id='standalone-runs'>"
        "<tr><th>compare</th><th>run folder</th><th>outcome (MLLOG)</th><th>time to train</th>"
        f"<th>compliance checker</th><th>DAG run (grid)</th></tr>{rows}</table>"
        "<p><button type='submit'>Compare the checked runs on one plot</button></p></form>"
    )


def index_page(
    index: Index,
    entries: Sequence[SubmissionEntry],
    runs: Sequence[RunView],
    dag_runs: Mapping[str, str | None],
    base: str,
) -> str:
    root = index.root
    if not entries:
        body = f"<p class='muted'>No submission under <code>{_e(root)}</code> yet.</p>"
    else:
        rows = []
        for e in entries:
            score = "-" if e.score_minutes is None else f"{e.score_minutes:.4f} min"
            verdict = _overall(e)
            checks = "<br>".join(_verdict(v) for _, v in e.verdicts)
            rows.append(
                f"<tr data-submission='{_e(e.name)}'>"
                f"<td>{_link(_q('submission', name=e.name), e.name)}</td><td>{verdict}</td>"
                f"<td>{_e(score)}</td><td>{checks}</td>"
                f"<td>{'<br>'.join(_e(f'seed {r.seed}: {r.run.outcome}') for r in e.runs)}"
                "</td></tr>"
            )
        body = (
            "<table id='submissions'><tr><th>submission</th><th>verdict</th><th>score</th>"
            "<th>checkers</th><th>runs</th></tr>" + "".join(rows) + "</table>"
        )
    standalone = (
        f"<h2>Runs outside a submission</h2>{_runs_list(runs, dag_runs, base)}"
        if runs
        else "<p class='muted'>No run outside a submission.</p>"
    )
    skipped = (
        "<p class='muted'>Not shown:</p><ul class='muted' id='skipped'>"
        + "".join(f"<li>{_e(s)}</li>" for s in index.skipped)
        + "</ul>"
        if index.skipped
        else ""
    )
    return _page(
        "MLPerf RCP",
        f"<h1>MLPerf {_e(recipe.BENCHMARK)}</h1>"
        f"<p class='muted'>Storage root <code>{_e(root)}</code>; ruleset {_e(recipe.RULESET)}, "
        f"target eval_accuracy (pass@4) &gt; {recipe.TARGET_ACCURACY}.</p>"
        f"<h2>Submissions</h2>{body}{standalone}{skipped}",
    )


def _plot_block(kind: str, **params: str | list[str]) -> str:
    """The plot by step and against wall-clock minutes, each with its PNG and SVG links."""
    blocks = []
    for view, element, alt in (
        ("step", "plot", "pass@4 by step"),
        ("time", "plot-time", "pass@4 against minutes from run_start"),
    ):
        query = urlencode({**params, "view": view}, doseq=True)
        png, svg = f"plot/{kind}.png?{query}", f"plot/{kind}.svg?{query}"
        blocks.append(
            f"<p><img id='{element}' class='plot' src='{_e(png)}' width='960' height='540' "
            f"alt='{_e(alt)}'></p><p>{_link(png, 'PNG')} · {_link(svg, 'SVG')}</p>"
        )
    return "".join(blocks)


def submission_page(entry: SubmissionEntry, numbers: RcpNumbers | None, base: str) -> str:
    score = "-" if entry.score_minutes is None else f"{entry.score_minutes:.4f} minutes"
    verdict = _overall(entry)
    report = (
        _link(_q("file/report", name=entry.name), "report.md")
        if entry.report_path
        else "<span class='muted'>no report.md yet</span>"
    )
    if entry.report_html_path:
        report += " · " + _link(f"report/{quote(entry.name)}/report.html", "report.html")
    compliance = "".join(
        f"<p>compliance of seed {r.seed}:</p>{_verdict_errors(r.run.compliance)}"
        for r in entry.runs
        if r.run.compliance is not None and not r.run.compliance.ok
    )
    rcp = dict(entry.verdicts).get("rcp_checker")
    problems = list(entry.problems) + [
        f"seed {r.seed}: {p}" for r in entry.runs for p in r.run.problems
    ]
    return _page(
        f"submission {entry.name}",
        f"<p>{_link('./', 'all submissions')}</p>"
        f"<h1>Submission <code>{_e(entry.name)}</code></h1>"
        f"<p>Verdict: <span id='verdict'>{verdict}</span> · score (result summarizer): "
        f"<span id='score'>{_e(score)}</span> · {report}</p>"
        f"<p class='muted'>Folder <code>{_e(entry.folder)}</code></p>"
        f"{_problems(problems)}"
        f"<h2>Checkers</h2>{_verdicts_table(entry)}"
        f"<h2>RCP checker's numbers</h2>{rcp_numbers_block(numbers, rcp)}"
        f"<h2>Runs</h2>{_runs_table(base, entry.runs)}{compliance}"
        f"<h2>Convergence</h2>{_plot_block('submission', name=entry.name)}",
    )


def compare_page(runs: Sequence[RunView]) -> str:
    paths = [r.path for r in runs]
    rows = "".join(
        f"<tr data-run='{_e(r.path)}'><td>{_link(_q('run', path=r.path), r.path)}</td>"
        f"<td class='outcome'>{_e(r.outcome)}</td>"
        f"<td class='ttt'>{_e(_minutes(r.minutes_to_train))}</td></tr>"
        for r in runs
    )
    return _page(
        "compare runs",
        f"<p>{_link('./', 'all submissions')}</p><h1>{len(runs)} runs compared</h1>"
        "<table id='compared'><tr><th>run folder</th><th>outcome (MLLOG)</th>"
        f"<th>time to train</th></tr>{rows}</table>"
        f"<h2>Convergence</h2>{_plot_block('runs', path=paths)}",
    )


def _gate(step: StepStatus) -> str:
    if step.gate == "skip":
        return f"skip (step {step.skipped_for} passed)"
    return step.gate


def _checkpoint_cell(step: StepStatus) -> str:
    if step.checkpoint_problem:  # its storage could not be reached: unknown, and why
        return f"?<br><code>{_e(step.checkpoint_problem)}</code>"
    return "yes" if step.checkpoint_present else "no"


def _step_row(path: str, step: StepStatus) -> str:
    passed = step.gate == "passes"
    cls = "passed" if passed else ("skip" if step.gate == "skip" else "")
    accuracy = "-" if step.eval_accuracy is None else f"{step.eval_accuracy:.4f}"
    if not step.attempt_records:
        accuracy += " (not recomputed: no per-attempt records)"
    evaluation = _e(step.summary)
    if step.problems:
        evaluation += f"<br><code>{_e('; '.join(step.problems))}</code>"
    if step.summary != "missing":
        evaluation += " " + _link(_q("file/summary", path=path, step=step.step), "summary.json")
    return (
        f"<tr class='{cls}' data-step='{step.step}'><td>{step.step}</td>"
        f"<td>{_e(_time(step.timestamp_ms))}</td><td>{step.samples_count}</td>"
        f"<td>{_checkpoint_cell(step)}</td><td>{evaluation}</td>"
        f"<td class='pass4'>{_e(accuracy)}</td><td>{_e(_gate(step))}</td></tr>"
    )


def _retention_block(run: RunView) -> str:
    """What retention kept and deleted, and why (its record, via `rcpflow status`)."""
    notes = run.status.retention
    if not notes:
        return "<p class='muted' id='retention'>Retention: no apply recorded (nothing deleted)</p>"
    rows = "".join(
        f"<tr data-step='{n.step}' data-part='{_e(n.part)}' data-state='{_e(n.state)}'>"
        f"<td>{n.step}</td><td>{_e(n.part)}</td><td>{_e(n.state)}</td><td>{_e(n.reason)}</td>"
        f"<td>{_e(_time(n.when_ms)) if n.when_ms is not None else ''}</td></tr>"
        for n in notes
    )
    head = "<tr><th>step</th><th>part</th><th>state</th><th>why</th><th>deleted (UTC)</th></tr>"
    return f"<h2>Retention</h2><table id='retention'>{head}{rows}</table>"


def run_page(run: RunView, dag_run_id: str | None, base: str) -> str:
    head = (
        "<tr><th>step</th><th>weight update (UTC)</th><th>samples</th><th>checkpoint</th>"
        "<th>summary</th><th>pass@4</th><th>gate</th></tr>"
    )
    rows = "".join(_step_row(run.path, s) for s in run.status.steps)
    stop = run.logged_stop
    stop_text = (
        "none"
        if stop is None
        else f"status={stop.status} at {_time(stop.time_ms)} (step "
        f"{'?' if stop.step is None else stop.step}, samples_count "
        f"{'missing' if stop.samples_count is None else stop.samples_count})"
    )
    files = " · ".join(
        [
            _link(_q("file/mllog", path=run.path), "MLLOG"),
            _link(_q("file/manifest", path=run.path), "manifest"),
        ]
    )
    s = run.settings
    settings = (
        "no usable manifest rows"
        if s is None
        else f"seed {s.seed}, global_batch_size {s.global_batch_size}, validation from step "
        f"{s.val_start_at}, max_steps {s.max_steps}, target pass@4 &gt; {s.target_accuracy}"
    )
    warnings = "".join(f"<li>{_e(w)}</li>" for w in run.status.warnings)
    training = (
        f"{len(run.training)} training steps with reward/loss"
        if run.training
        else "no training reward or loss logged"
    )
    return _page(
        f"run {run.path}",
        f"<p>{_link('./', 'all submissions')}</p><h1>Run <code>{_e(run.path)}</code></h1>"
        f"<p class='muted'>{settings}; evaluation schedule <span id='eval-schedule'>"
        f"{_e(run.eval_schedule or 'not recorded in the run folder')}</span></p>"
        f"<p>Outcome: <span id='outcome'>{_e(run.outcome)}</span></p>"
        f"<p>Time to train (run_start to run_stop): <span id='time-to-train'>"
        f"{_e(_minutes(run.minutes_to_train))}</span> · run_start "
        f"<span id='run-start'>{_e(_time(run.run_start_ms))}</span></p>"
        f"<p>run_stop in the MLLOG: <span id='run-stop'>{_e(stop_text)}</span></p>"
        f"<p>finalize would write now: <span id='finalize-now'>{_e(_finalize_now(run))}</span>"
        f"</p><p>Official compliance checker: <span id='compliance'>"
        f"{_verdict(run.compliance)}</span>{_verdict_errors(run.compliance)}</p>"
        f"<p>Files: {files} · DAG run: {_dag_run_link(base, dag_run_id)}</p>"
        + _problems(run.problems)
        + (f"<ul class='muted'>{warnings}</ul>" if warnings else "")
        + f"<h2>Checkpoints</h2><table id='steps'>{head}{rows}</table>"
        + _retention_block(run)
        + "<h2>Convergence</h2>"
        f"<p class='muted'>Marks along the step axis are steps without a "
        f"score: skipped (a lower step passed), invalid summary, not evaluated.</p>"
        f"<p class='muted' id='training'>{_e(training)}</p>"
        f"{_plot_block('run', path=run.path)}",
    )


def outside_root_page(run_dir: str, root: str) -> str:
    return _page(
        "outside the storage root",
        f"<p>The run folder <code>{_e(run_dir)}</code> is not below this deployment's storage "
        f"root <code>{_e(root)}</code>; the RCP view shows only what is under it.</p>",
    )
