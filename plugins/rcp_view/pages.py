"""The RCP view's HTML: plain server-rendered pages (no script), every value escaped.

The pages run inside the Airflow UI's iframe; links into the UI itself (a DAG run's grid)
open in the top window. Element ids and ``data-*`` attributes are stable: the browser test and
anyone scripting against the page read them.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

from rcpflow import recipe
from tasks.status_adapter import RunStatus, StepStatus
from tasks.storage_index import RunEntry, SubmissionEntry
from tasks.verdicts import Verdict

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
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _link(href: str, text: str, *, top: bool = False, cls: str = "") -> str:
    target = " target='_top'" if top else ""
    klass = f" class='{_e(cls)}'" if cls else ""
    return f"<a href='{_e(href)}'{target}{klass}>{_e(text)}</a>"


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _verdict(verdict: Verdict | None) -> str:
    if verdict is None:
        return "<span class='muted'>not run</span>"
    cls = "ok" if verdict.ok else "fail"
    return f"<span class='{cls}'>{_e(verdict.headline())}</span>"


def _overall(entry: SubmissionEntry) -> str:
    verdict = entry.verdict
    cls = {"PASS": "ok", "FAIL": "fail"}.get(verdict, "muted")
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


def run_outcome(status: RunStatus) -> str:
    """How the run ended, in the words of its MLLOG (finalize's ``run_stop``)."""
    if status.manifest_error is not None:
        return f"no valid manifest: {status.manifest_error}"
    stop = status.run_stop
    if stop is None:
        return "no run_stop (not finalized, or incomplete)"
    if stop.status == "success":
        return f"success: converged at step {stop.step}"
    if stop.status == "aborted":
        return f"aborted: did not converge by step {stop.step}"
    return f"{stop.status} at step {stop.step}"


def _run_row(base: str, run: RunEntry) -> str:
    s = run.status
    return (
        f"<tr data-seed='{run.seed}'><td>{run.seed}</td>"
        f"<td>{_link(_q('run', path=run.path), run.path)}</td>"
        f"<td class='outcome'>{_e(run_outcome(s))}</td>"
        f"<td>{_e(s.passing_step if s.passing_step is not None else '-')}</td>"
        f"<td>{_verdict(run.compliance)}</td>"
        f"<td>{_link(_grid(base, run.dag_id, run.dag_run_id), run.dag_run_id, top=True)}</td></tr>"
    )


def _runs_table(base: str, runs: Sequence[RunEntry]) -> str:
    head = (
        "<tr><th>seed</th><th>run folder</th><th>outcome (MLLOG)</th><th>passing step</th>"
        "<th>compliance checker</th><th>DAG run (grid)</th></tr>"
    )
    return f"<table id='runs'>{head}{''.join(_run_row(base, r) for r in runs)}</table>"


def _verdicts_table(entry: SubmissionEntry) -> str:
    rows = "".join(
        f"<tr data-tool='{_e(tool)}'><td>{_e(tool)}</td><td>{_verdict(v)}{_verdict_errors(v)}"
        "</td></tr>"
        for tool, v in entry.verdicts
    )
    return f"<table id='checkers'><tr><th>checker</th><th>verdict</th></tr>{rows}</table>"


def index_page(root: str, entries: Sequence[SubmissionEntry], base: str) -> str:
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
                f"<td>{'<br>'.join(_e(f'seed {r.seed}: {run_outcome(r.status)}') for r in e.runs)}"
                "</td></tr>"
            )
        body = (
            "<table id='submissions'><tr><th>submission</th><th>verdict</th><th>score</th>"
            "<th>checkers</th><th>runs</th></tr>" + "".join(rows) + "</table>"
        )
    return _page(
        "MLPerf RCP",
        f"<h1>MLPerf {_e(recipe.BENCHMARK)} submissions</h1>"
        f"<p class='muted'>Storage root <code>{_e(root)}</code>; ruleset {_e(recipe.RULESET)}, "
        f"target eval_accuracy (pass@4) &gt; {recipe.TARGET_ACCURACY}.</p>{body}",
    )


def _plot_block(kind: str, **params: str) -> str:
    png = _q(f"plot/{kind}.png", **params)
    svg = _q(f"plot/{kind}.svg", **params)
    return (
        f"<p><img id='plot' class='plot' src='{_e(png)}' width='960' height='540' "
        f"alt='pass@4 by step'></p><p>{_link(png, 'PNG')} · {_link(svg, 'SVG')}</p>"
    )


def submission_page(entry: SubmissionEntry, base: str) -> str:
    score = "-" if entry.score_minutes is None else f"{entry.score_minutes:.4f} minutes"
    verdict = _overall(entry)
    report = (
        _link(_q("file/report", name=entry.name), "report.md")
        if entry.report_path
        else "<span class='muted'>no report.md yet</span>"
    )
    compliance = "".join(
        f"<p>compliance of seed {r.seed}:</p>{_verdict_errors(r.compliance)}"
        for r in entry.runs
        if r.compliance is not None and not r.compliance.ok
    )
    return _page(
        f"submission {entry.name}",
        f"<p>{_link('./', 'all submissions')}</p>"
        f"<h1>Submission <code>{_e(entry.name)}</code></h1>"
        f"<p>Verdict: <span id='verdict'>{verdict}</span> · score (result summarizer): "
        f"<span id='score'>{_e(score)}</span> · {report}</p>"
        f"<p class='muted'>Folder <code>{_e(entry.folder)}</code></p>"
        f"<h2>Checkers</h2>{_verdicts_table(entry)}"
        f"<h2>Runs</h2>{_runs_table(base, entry.runs)}{compliance}"
        f"<h2>Convergence</h2>{_plot_block('submission', name=entry.name)}",
    )


def _gate(row: StepStatus) -> str:
    if row.gate == "skip":
        return f"skip (step {row.decided_by} passed)"
    return row.gate


def _step_row(path: str, row: StepStatus) -> str:
    cls = "passed" if row.passed else ("skip" if row.gate == "skip" else "")
    accuracy = "-" if row.pass_at_4 is None else f"{row.pass_at_4:.4f}"
    evaluation = _e(row.evaluation)
    if row.problem:
        evaluation += f"<br><code>{_e(row.problem)}</code>"
    if row.evaluation != "not evaluated":
        evaluation += " " + _link(_q("file/summary", path=path, step=row.step), "summary.json")
    return (
        f"<tr class='{cls}' data-step='{row.step}'><td>{row.step}</td>"
        f"<td>{_e(_time(row.timestamp_ms))}</td><td>{row.samples_count}</td>"
        f"<td>{'yes' if row.checkpoint_present else 'no'}</td><td>{evaluation}</td>"
        f"<td class='pass4'>{_e(accuracy)}</td><td>{_e(_gate(row))}</td>"
        f"<td>{'passes' if row.passed else ''}</td></tr>"
    )


def run_page(path: str, status: RunStatus, compliance: Verdict | None, base: str) -> str:
    head = (
        "<tr><th>step</th><th>weight update (UTC)</th><th>samples</th><th>checkpoint</th>"
        "<th>evaluation</th><th>pass@4</th><th>gate</th><th></th></tr>"
    )
    rows = "".join(_step_row(path, r) for r in status.rows)
    stop = status.run_stop
    stop_text = (
        "none"
        if stop is None
        else f"status={stop.status} at {_time(stop.time_ms)} (step {stop.step}, "
        f"samples_count {stop.samples_count})"
    )
    files = " · ".join(
        [
            _link(_q("file/mllog", path=path), "MLLOG"),
            _link(_q("file/manifest", path=path), "manifest"),
        ]
    )
    settings = (
        f"seed {_e(status.seed)}, global_batch_size {_e(status.global_batch_size)}, "
        f"validation from step {_e(status.val_start_at)}, max_steps {_e(status.max_steps)}, "
        f"target pass@4 &gt; {_e(status.target_accuracy)}"
    )
    return _page(
        f"run {path}",
        f"<p>{_link('./', 'all submissions')}</p><h1>Run <code>{_e(path)}</code></h1>"
        f"<p class='muted'>{settings}</p>"
        f"<p>Outcome: <span id='outcome'>{_e(run_outcome(status))}</span></p>"
        f"<p>run_stop in the MLLOG: <span id='run-stop'>{_e(stop_text)}</span></p>"
        f"<p>Official compliance checker: <span id='compliance'>{_verdict(compliance)}</span>"
        f"{_verdict_errors(compliance)}</p><p>Files: {files}</p>"
        f"<h2>Checkpoints</h2><table id='steps'>{head}{rows}</table>"
        f"<h2>Convergence</h2>{_plot_block('run', path=path)}",
    )


def outside_root_page(run_dir: str, root: str) -> str:
    return _page(
        "outside the storage root",
        f"<p>The run folder <code>{_e(run_dir)}</code> is not below this deployment's storage "
        f"root <code>{_e(root)}</code>; the RCP view shows only what is under it.</p>",
    )
