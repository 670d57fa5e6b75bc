"""The RCP view's FastAPI app: HTML pages, their JSON, the plot and the run's files; read-only.

Every route sits behind Airflow's own authentication and authorization: the dependency the
API's DAG-run routes use (`requires_access_dag("GET", RUN)`), which takes the JWT from the
``Authorization`` header or from the ``_token`` cookie the UI's login sets (that is how the
view's iframe is authenticated). Without a valid token: 401/403, nothing read.

Only what lies below the deployment's storage root is shown; a path from a URL is resolved by
`tasks.views.storage_index.resolve_under`, which refuses ``..``, absolute paths and symlinks out of
the root, and every file served is checked the same way (`confined_file`). What a run or a
submission is, passed or skipped, comes from rcpflow and the persisted verdicts through
`tasks.views.storage_index`; this module only turns it into pages. A file that cannot be read is a
named problem on its page (storage_index), never a 500. The API docs (``/openapi.json``,
``/docs``, ``/redoc``) are off: FastAPI serves them outside the app's dependencies.
``report.html`` is shown as HTML under a sandboxing Content-Security-Policy (no scripts, no
access to the UI's origin): it comes from storage, not from this app.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from plugins.rcp_view import URL_PREFIX, pages
from plugins.rcp_view.train_log import dag_run_of, run_dags, with_trainer_log
from rcpflow.files.layout import MANIFEST_NAME, RunLayout, is_gcs, join
from rcpflow.files.storage import StorageError, storage_for
from tasks.deployment import load_deployment
from tasks.names import SUBMISSION_DAG_ID
from tasks.submission.spec import name_from_run_id
from tasks.views.convergence import MEDIA_TYPES, PlotView, image_format, render
from tasks.views.storage_index import (
    REPORT_HTML,
    REPORT_MD,
    NotUnderRoot,
    RunView,
    SubmissionEntry,
    confined_file,
    convergence,
    index,
    rcp_numbers_of,
    resolve_under,
    run_settings,
    run_view,
    submission_entry,
)

MAX_PLOT_PX = 2400
MAX_COMPARED = 12
RunPath = Annotated[str, Query(description="run folder, relative to the storage root")]
RunPaths = Annotated[
    list[str], Query(min_length=1, max_length=MAX_COMPARED, description="run folders to compare")
]
SubmissionName = Annotated[str, Query(description="submission folder under the storage root")]
ReportFormat = Literal["md", "html"]
ReportFile = Literal["report.html", "report.md", "convergence.png", "convergence.svg"]
PlotPx = Annotated[int, Query(ge=100, le=MAX_PLOT_PX, description="image size in pixels")]
View = Annotated[PlotView, Query(description="x-axis: step, or minutes from run_start")]
# report.html from storage: rendered, but in an opaque origin without scripts.
REPORT_CSP = (
    "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'self'"
)
_REPORT_TYPES = {
    "report.html": "text/html; charset=utf-8",
    "report.md": "text/markdown; charset=utf-8",
    "convergence.png": "image/png",
    "convergence.svg": "image/svg+xml",
}


def storage_root() -> str:
    return load_deployment().storage_root


def _run_dir(path: str) -> str:
    try:
        return resolve_under(storage_root(), path)
    except NotUnderRoot as exc:
        raise HTTPException(404, str(exc)) from exc


def _run(path: str) -> RunView:
    try:
        return run_view(storage_root(), path)
    except NotUnderRoot as exc:
        raise HTTPException(404, str(exc)) from exc


def _submission(name: str) -> SubmissionEntry:
    try:
        return submission_entry(storage_root(), name)
    except NotUnderRoot as exc:
        raise HTTPException(404, str(exc)) from exc


def _relative(run_dir: str) -> str | None:
    """`run_dir` relative to the storage root, or None if it is not below it."""
    root = storage_root().rstrip("/")
    run_dir = RunLayout(run_dir).root
    if is_gcs(root) != is_gcs(run_dir):
        return None
    rel = posixpath.relpath(run_dir, root) if is_gcs(root) else os.path.relpath(run_dir, root)
    return None if rel == "." or rel.startswith("..") else rel


def _airflow_base(request: Request) -> str:
    """The UI's base path: the mount point of this app without its own prefix."""
    root_path = str(request.scope.get("root_path", ""))
    return root_path[: -len(URL_PREFIX)] if root_path.endswith(URL_PREFIX) else root_path


def _json(value: Any) -> JSONResponse:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return JSONResponse(dataclasses.asdict(value))
    return JSONResponse(value)


def _run_json(view: RunView) -> dict[str, Any]:
    return {**dataclasses.asdict(view), "passing_step": view.passing_step}


def _submission_json(entry: SubmissionEntry) -> dict[str, Any]:
    return {
        **dataclasses.asdict(entry),
        "runs": [
            {"seed": r.seed, "dag_run_id": r.dag_run_id, **_run_json(r.run)} for r in entry.runs
        ],
        "verdict": entry.verdict,
        "score_minutes": entry.score_minutes,
    }


def _file_bytes(path: str) -> bytes:
    """A file below the storage root (symlinks resolved); 404 naming it otherwise."""
    try:
        confined_file(storage_root(), path)
        storage = storage_for(path)
        if not storage.exists(path) or os.path.isdir(path):
            raise HTTPException(404, f"{path}: no such file")
        return storage.read_bytes(path)
    except NotUnderRoot as exc:
        raise HTTPException(404, str(exc)) from exc
    except StorageError as exc:
        raise HTTPException(404, f"cannot read: {exc}") from exc


def _text_file(path: str, download_name: str) -> Response:
    return Response(
        _file_bytes(path),
        media_type="text/plain; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{download_name}"'},
    )


@dataclasses.dataclass(frozen=True)
class PlotArgs:
    """What every plot route takes besides what it plots: the image's format, size and x-axis."""

    fmt: str
    width: int
    height: int
    view: PlotView


def _plot_args(
    fmt: str, width: PlotPx = 960, height: PlotPx = 540, view: View = "step"
) -> PlotArgs:
    return PlotArgs(fmt, width, height, view)


Plot = Annotated[PlotArgs, Depends(_plot_args)]


def _plot(runs: list[RunView], title: str, plot: PlotArgs) -> Response:
    try:
        checked = image_format(plot.fmt)
    except ValueError as exc:
        raise HTTPException(404, str(exc)) from exc
    image = render(convergence(title, runs), checked, (plot.width, plot.height), plot.view)
    return Response(image, media_type=MEDIA_TYPES[checked])


def _submission_runs(session: Any) -> set[str]:
    """Names of the submissions Airflow has run (one still training has no files of its own)."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    rows = session.execute(
        select(DagRun.run_id, DagRun.conf).where(DagRun.dag_id == SUBMISSION_DAG_ID)
    )
    return {str((conf or {}).get("submission_name") or name_from_run_id(rid)) for rid, conf in rows}


def create_app() -> FastAPI:
    app = FastAPI(
        title="MLPerf RCP view",
        description="Submissions, runs, checker verdicts and convergence plots of rcpflow.",
        dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))],
        openapi_url=None,  # the docs routes would answer without the dependency above
        docs_url=None,
        redoc_url=None,
    )

    # ---- JSON ---------------------------------------------------------------------------

    @app.get("/api/submissions")
    def api_submissions(session: SessionDep) -> JSONResponse:
        root = storage_root()
        found = index(root, _submission_runs(session))
        submissions = [_submission_json(submission_entry(root, n)) for n in found.submissions]
        runs = [_run_json(run_view(root, p)) for p in found.runs]
        return _json(
            {
                "storage_root": root,
                "submissions": submissions,
                "runs": runs,
                "skipped": list(found.skipped),
            }
        )

    @app.get("/api/submission")
    def api_submission(name: SubmissionName) -> JSONResponse:
        return _json(_submission_json(_submission(name)))

    @app.get("/api/run")
    def api_run(path: RunPath) -> JSONResponse:
        return _json(_run_json(_run(path)))

    # ---- pages --------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse)
    def index_page(request: Request, session: SessionDep) -> HTMLResponse:
        root = storage_root()
        found = index(root, _submission_runs(session))
        entries = [submission_entry(root, n) for n in found.submissions]
        runs = [run_view(root, p) for p in found.runs]
        dags = run_dags(session)
        dag_runs = {r.path: dags.get(RunLayout(r.run_dir).root) for r in runs}
        page = pages.index_page(found, entries, runs, dag_runs, _airflow_base(request))
        return HTMLResponse(page)

    @app.get("/submission", response_class=HTMLResponse)
    def submission_page(request: Request, name: SubmissionName) -> HTMLResponse:
        entry = _submission(name)
        numbers = rcp_numbers_of([r.run for r in entry.runs])
        return HTMLResponse(pages.submission_page(entry, numbers, _airflow_base(request)))

    @app.get("/compare", response_class=HTMLResponse)
    def compare_page(path: RunPaths) -> HTMLResponse:
        return HTMLResponse(pages.compare_page([_run(p) for p in path]))

    @app.get("/run", response_class=HTMLResponse)
    def run_page(request: Request, path: RunPath, session: SessionDep) -> HTMLResponse:
        run = _run(path)
        dag_run_id = dag_run_of(session, run.run_dir)
        run = with_trainer_log(session, run, dag_run_id)
        return HTMLResponse(pages.run_page(run, dag_run_id, _airflow_base(request)))

    @app.get("/dag-run/{dag_id}/{run_id}", response_class=HTMLResponse, response_model=None)
    def dag_run_page(request: Request, dag_id: str, run_id: str, session: SessionDep) -> Response:
        """The tab on a DAG run's page: the run or submission that DAG run worked on."""
        from airflow.models.dagrun import DagRun
        from sqlalchemy import select

        conf = session.scalar(
            select(DagRun.conf).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
        )
        if conf is None:
            raise HTTPException(404, f"no DAG run {run_id!r} of {dag_id!r}")
        if conf.get("run_dir"):
            rel = _relative(str(conf["run_dir"]))
            if rel is None:
                return HTMLResponse(pages.outside_root_page(str(conf["run_dir"]), storage_root()))
            target = f"run?{urlencode({'path': rel})}"
        elif dag_id == SUBMISSION_DAG_ID:
            name = conf.get("submission_name") or name_from_run_id(run_id)
            target = f"submission?{urlencode({'name': str(name)})}"
        else:
            target = ""
        # Built from the mount point, not url_for: names resolve against the root app's router,
        # which sees this app only as a mounted ASGI callable.
        return RedirectResponse(f"{request.scope['root_path']}/{target}", status_code=303)

    # ---- plot and files -----------------------------------------------------------------

    @app.get("/plot/run.{fmt}")
    def run_plot(path: RunPath, session: SessionDep, plot: Plot) -> Response:
        run = with_trainer_log(session, _run(path), None)
        return _plot([run], f"run {path}", plot)

    @app.get("/plot/runs.{fmt}")
    def runs_plot(path: RunPaths, session: SessionDep, plot: Plot) -> Response:
        runs = [with_trainer_log(session, _run(p), None) for p in path]
        return _plot(runs, f"{len(runs)} runs compared", plot)

    @app.get("/plot/submission.{fmt}")
    def submission_plot(name: SubmissionName, session: SessionDep, plot: Plot) -> Response:
        entry = _submission(name)
        runs = [
            dataclasses.replace(
                with_trainer_log(session, r.run, r.dag_run_id), path=f"seed {r.seed}"
            )
            for r in entry.runs
        ]
        return _plot(runs, f"submission {name}", plot)

    @app.get("/file/mllog")
    def mllog_file(path: RunPath) -> Response:
        settings = run_settings(_run_dir(path))
        if settings is None:
            raise HTTPException(404, f"{path}: no usable manifest, so no MLLOG is known")
        return _text_file(settings.mllog_path, os.path.basename(settings.mllog_path))

    @app.get("/file/manifest")
    def manifest_file(path: RunPath) -> Response:
        return _text_file(RunLayout(_run_dir(path)).manifest, MANIFEST_NAME)

    @app.get("/file/summary")
    def summary_file(path: RunPath, step: Annotated[int, Query(ge=0, le=2**62)]) -> Response:
        summary = RunLayout(_run_dir(path)).summary(step)
        return _text_file(summary, f"summary_step_{step}.json")

    @app.get("/file/report")
    def report_file(name: SubmissionName, format: ReportFormat = "md") -> Response:
        entry = _submission(name)
        path = entry.report_html_path if format == "html" else entry.report_path
        if path is None:
            raise HTTPException(404, f"{name}: no report.{format} yet")
        return _text_file(path, f"{name}_report.{format}")  # a download

    @app.get("/report/{name}/{file}")
    def report_page(name: str, file: ReportFile) -> Response:
        """report.html as a page (its plot files beside it, as its links expect them)."""
        folder = _submission(name).folder
        names = {"report.html": REPORT_HTML, "report.md": REPORT_MD}
        data = _file_bytes(join(folder, names.get(file, file)))
        return Response(
            data,
            media_type=_REPORT_TYPES[file],
            headers={"Content-Security-Policy": REPORT_CSP, "X-Content-Type-Options": "nosniff"},
        )

    return app
