"""The RCP view's endpoints, mounted by Airflow's own API app from the plugins folder, behind
Airflow's auth. The storage root is built by the real writers (tests/synthetic_run.py, finalize,
packaging) and judged by the real checkers (their verdicts persisted as the check tasks do)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from devtools.synthetic_run import make_run
from rcpflow import recipe
from rcpflow.cli.status import run_status
from rcpflow.submission import checkers
from rcpflow.submission.package import SystemDescription, package_submission
from rcpflow.verdict.finalize import finalize
from tasks.results.verdicts import read_verdict, record

pytestmark = pytest.mark.timeout(300)

NAME = "sub1"
CONVERGES_AT = {1: 20, 2: 19, 3: 21}
ROUTES = [
    "/rcp/",
    "/rcp/api/submissions",
    f"/rcp/api/submission?name={NAME}",
    f"/rcp/api/run?path={NAME}/runs/seed_1",
    f"/rcp/run?path={NAME}/runs/seed_1",
    f"/rcp/plot/submission.png?name={NAME}",
    f"/rcp/file/mllog?path={NAME}/runs/seed_1",
]


@pytest.fixture(scope="module")
def storage_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One submission of three finalized closed-division runs, each checked by the official
    compliance checker, packaged and checked by the official RCP checker; the package checker
    and the result summarizer are left not run."""
    root = tmp_path_factory.mktemp("storage")
    folder = root / NAME
    run_dirs = []
    for seed, step in CONVERGES_AT.items():
        accuracies = {s: (0.75 if s == step else 0.5) for s in range(18, step + 1)}
        run = make_run(str(folder / "runs" / f"seed_{seed}"), seed=seed, accuracies=accuracies)
        assert finalize(run.run_dir).status == "success"
        log = run.layout.mllog(seed)
        record(checkers.compliance(log, "closed", str(folder / "tmp")), log, run.run_dir)
        run_dirs.append(run.run_dir)
    org = package_submission(run_dirs, list(CONVERGES_AT), str(folder), SystemDescription())
    results = str(Path(org) / "results" / "rcpflow-local-cpu" / recipe.BENCHMARK)
    record(checkers.rcp(results, str(folder / "tmp")), results, str(folder))
    (folder / "report.md").write_text("# report\n")
    (folder / "report.html").write_text("<script>alert(1)</script>\n")
    (root / "not_a_submission").mkdir()
    return root


@pytest.fixture(scope="module")
def client(airflow_db: str, storage_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """Airflow's API app as the api-server builds it (plugins included), on a deployment whose
    storage root is the one above."""
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    deployment = tmp_path_factory.mktemp("deployment") / "deployment.toml"
    deployment.write_text(f'storage_root = "{storage_root}"\n')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RCPFLOW_DEPLOYMENT", str(deployment))
        yield TestClient(create_app())


@pytest.fixture(scope="module")
def token(client: Any) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    user = SimpleAuthManagerUser(username="viewer", role="viewer")
    return get_auth_manager().generate_jwt(user)


@pytest.fixture
def get(client: Any, token: str) -> Iterator[Any]:
    def _get(url: str, **kw: Any) -> Any:
        return client.get(url, headers={"Authorization": f"Bearer {token}"}, **kw)

    yield _get


def test_the_plugin_is_registered_with_its_app_and_ui_entries(get: Any) -> None:
    plugins = get("/api/v2/plugins").json()["plugins"]
    (plugin,) = [p for p in plugins if p["name"] == "rcpflow"]
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/rcp"]
    views = {v["destination"]: v for v in plugin["external_views"]}
    assert views["nav"]["href"] == "/rcp/" and views["nav"]["url_route"] == "mlperf-rcp"
    assert views["dag_run"]["href"] == "/rcp/dag-run/{DAG_ID}/{RUN_ID}"
    assert get("/api/v2/plugins/importErrors").json()["import_errors"] == []


@pytest.mark.parametrize("route", ROUTES)
def test_refused_without_a_valid_token(client: Any, route: str) -> None:
    assert client.get(route).status_code == 401
    assert client.get(route, headers={"Cookie": "_token=not-a-jwt"}).status_code == 403
    assert client.get(route, headers={"Authorization": "Bearer x.y.z"}).status_code == 403


def test_the_ui_cookie_is_accepted(client: Any, token: str) -> None:
    response = client.get("/rcp/", headers={"Cookie": f"_token={token}"})
    assert response.status_code == 200 and NAME in response.text


def test_submissions_json_is_what_storage_holds(get: Any, storage_root: Path) -> None:
    body = get("/rcp/api/submissions").json()
    assert body["storage_root"] == str(storage_root)
    (sub,) = body["submissions"]  # not_a_submission has no runs/seed_<s>/
    assert sub["name"] == NAME and sub["report_path"] == str(storage_root / NAME / "report.md")
    assert sub["report_html_path"] == str(storage_root / NAME / "report.html")
    verdicts = dict(sub["verdicts"])
    assert set(verdicts) == {"rcp_checker", "package_checker", "result_summarizer"}
    rcp = read_verdict(str(storage_root / NAME), "rcp_checker")
    assert rcp is not None and verdicts["rcp_checker"]["ok"] == rcp.ok
    assert verdicts["rcp_checker"]["errors"] == list(rcp.errors)
    assert verdicts["package_checker"] is None and verdicts["result_summarizer"] is None
    # every compliance check and the RCP checker ran; two checkers did not: not a verdict yet
    assert sub["verdict"] == ("PENDING" if rcp.ok else "FAIL") and sub["score_minutes"] is None
    assert get(f"/rcp/api/submission?name={NAME}").json() == sub
    runs = sub["runs"]
    assert [r["seed"] for r in runs] == [1, 2, 3]
    assert [r["dag_run_id"] for r in runs] == [f"{NAME}__seed_{s}" for s in (1, 2, 3)]
    for r in runs:
        compliance = read_verdict(r["run_dir"], "compliance_checker")
        assert compliance is not None and r["compliance"]["ok"] == compliance.ok
        assert r["passing_step"] == CONVERGES_AT[r["seed"]]
        assert r["logged_stop"]["status"] == "success"
        assert r["status"]["finalize"]["status"] == "success"
        assert r["settings"]["global_batch_size"] == 256


def test_run_json_is_rcpflows_status(get: Any, storage_root: Path) -> None:
    body = get(f"/rcp/api/run?path={NAME}/runs/seed_2").json()
    status = run_status(str(storage_root / NAME / "runs" / "seed_2"))
    assert body["status"] == json.loads(status.to_json())
    assert body["passing_step"] == 19
    by_step = {s["step"]: s for s in body["status"]["steps"]}
    assert by_step[19]["gate"] == "passes" and by_step[19]["eval_accuracy"] > 0.69
    assert by_step[20]["gate"] == "skip" and by_step[20]["skipped_for"] == 19
    assert body["logged_stop"]["time_ms"] == by_step[19]["timestamp_ms"]  # backdated


def test_run_page_lists_every_step_and_links_the_grid(get: Any) -> None:
    page = get(f"/rcp/run?path={NAME}/runs/seed_1").text
    for step in range(18, 25):
        assert f"data-step='{step}'" in page
    assert "<tr class='passed' data-step='20'>" in page
    assert "success: converged at step 20" in page
    assert "compliance_checker: PASS" in page
    sub = get(f"/rcp/submission?name={NAME}").text
    assert "PENDING (2 checks not run yet)" in sub
    assert f"/dags/mlperf_grpo_run/runs/{NAME}__seed_1' data-ui='1'>" in sub


@pytest.mark.parametrize(("fmt", "media"), [("png", "image/png"), ("svg", "image/svg+xml")])
def test_plots(get: Any, fmt: str, media: str) -> None:
    response = get(f"/rcp/plot/submission.{fmt}?name={NAME}&width=800&height=450")
    assert response.status_code == 200 and response.headers["content-type"] == media
    if fmt == "png":
        assert Image.open(io.BytesIO(response.content)).size == (800, 450)
    assert get(f"/rcp/plot/run.{fmt}?path={NAME}/runs/seed_3").status_code == 200
    assert get(f"/rcp/plot/run.gif?path={NAME}/runs/seed_3").status_code == 404
    assert get(f"/rcp/plot/run.png?path={NAME}/runs/seed_3&width=99999").status_code == 422


def test_a_mix_of_batch_sizes_has_no_reference_point(storage_root: Path, tmp_path: Path) -> None:
    from tasks.views.storage_index import convergence, run_view

    one = run_view(str(storage_root), f"{NAME}/runs/seed_1")
    toy = make_run(str(tmp_path / "toy" / "runs" / "seed_1"), global_batch_size=16,
                   max_steps=4, val_start_at=2, accuracies={2: 0.2})  # fmt: skip
    data = convergence("mix", [one, run_view(str(tmp_path), "toy/runs/seed_1")])
    assert data.global_batch_size is None and data.reference is None
    assert [c.seed for c in data.curves] == [1, toy.seed]
    assert convergence("one", [one]).reference is not None


def test_files_download_as_text(get: Any, storage_root: Path) -> None:
    run_dir = storage_root / NAME / "runs" / "seed_1"
    mllog = get(f"/rcp/file/mllog?path={NAME}/runs/seed_1")
    assert mllog.headers["content-disposition"] == 'attachment; filename="seed_1.out"'
    assert mllog.content == (run_dir / "mllog" / "seed_1.out").read_bytes()
    manifest = get(f"/rcp/file/manifest?path={NAME}/runs/seed_1")
    assert manifest.content == (run_dir / "mllog" / "eval_checkpoints.jsonl").read_bytes()
    summary = get(f"/rcp/file/summary?path={NAME}/runs/seed_1&step=18")
    assert summary.content == (run_dir / "eval" / "step_18" / "summary.json").read_bytes()
    assert get(f"/rcp/file/summary?path={NAME}/runs/seed_1&step=23").status_code == 404
    assert get(f"/rcp/file/report?name={NAME}").text == "# report\n"
    html = get(f"/rcp/file/report?name={NAME}&format=html")
    assert html.text == "<script>alert(1)</script>\n"  # from storage: downloaded, not shown
    assert html.headers["content-type"].startswith("text/plain")
    assert html.headers["content-disposition"] == f'attachment; filename="{NAME}_report.html"'
    assert get(f"/rcp/file/report?name={NAME}&format=pdf").status_code == 422


@pytest.mark.parametrize(
    "path", ["../etc", "/etc", f"{NAME}/../..", f"{NAME}/runs/seed_1/%2e%2e", "a b"]
)
def test_paths_outside_the_root_are_refused(get: Any, path: str) -> None:
    response = get("/rcp/api/run", params={"path": path})
    assert response.status_code == 404
    assert "is not a folder below the storage root" in response.json()["detail"]


def _dag_run(dag_id: str, run_id: str, conf: dict[str, Any]) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType
    from pendulum import now

    with create_session() as session:
        session.add(
            DagRun(
                dag_id=dag_id, run_id=run_id, run_type=DagRunType.MANUAL, conf=conf,
                state=DagRunState.SUCCESS, run_after=now("UTC"),
            )
        )  # fmt: skip


def test_dag_run_tab_opens_the_run_or_submission_it_worked_on(
    get: Any, storage_root: Path, tmp_path: Path
) -> None:
    run_dir = storage_root / NAME / "runs" / "seed_1"
    _dag_run("mlperf_grpo_run", "tab-run", {"run_dir": str(run_dir)})
    _dag_run("mlperf_grpo_deferred_eval", "tab-eval", {"run_dir": str(run_dir) + "/"})
    _dag_run("mlperf_grpo_submission", NAME, {"submission_name": None})
    _dag_run("mlperf_grpo_run", "tab-outside", {"run_dir": str(tmp_path)})
    for dag_id, run_id in (
        ("mlperf_grpo_run", "tab-run"),
        ("mlperf_grpo_deferred_eval", "tab-eval"),
    ):
        answer = get(f"/rcp/dag-run/{dag_id}/{run_id}", follow_redirects=False)
        assert answer.status_code == 303
        assert answer.headers["location"] == f"/rcp/run?path={NAME}%2Fruns%2Fseed_1"
    answer = get(f"/rcp/dag-run/mlperf_grpo_submission/{NAME}", follow_redirects=False)
    assert answer.headers["location"] == f"/rcp/submission?name={NAME}"  # named by its run id
    outside = get("/rcp/dag-run/mlperf_grpo_run/tab-outside")
    assert (
        outside.status_code == 200 and "is not below this deployment's storage root" in outside.text
    )
    assert get("/rcp/dag-run/mlperf_grpo_run/nope").status_code == 404


def test_the_submission_page_shows_the_rcp_checkers_numbers(get: Any) -> None:
    from rcpflow.records.rcp_reference import reference_means

    page = get(f"/rcp/submission?name={NAME}").text
    mean = reference_means()[256]
    samples = {seed: step * 256 for seed, step in CONVERGES_AT.items()}
    middle = sorted(samples, key=samples.__getitem__)[1]  # olympic: fastest and slowest dropped
    assert f"<tr data-rcp='reference-mean'><th>reference mean</th><td>{mean:.0f} samples" in page
    assert f"<tr data-rcp='submission-mean'><th>this submission&#x27;s mean</th><td>" \
        f"{samples[middle]} samples" in page  # fmt: skip
    assert f"<td>{middle} (dropped, fastest and slowest: " in page
    verdict = "passes" if samples[middle] >= mean else "fails"
    assert f"<tr data-rcp='why'><th>why</th><td>{verdict}: the submission" in page
    for seed, n in samples.items():
        assert f"seed {seed}: {n} samples" in page


def test_report_html_is_shown_as_a_sandboxed_page(get: Any) -> None:
    page = get(f"/rcp/report/{NAME}/report.html")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "sandbox" in page.headers["content-security-policy"]
    assert "script-src" not in page.headers["content-security-policy"]  # none: default-src
    assert get(f"/rcp/report/{NAME}/secrets.txt").status_code == 422
    assert get("/rcp/report/nope/report.html").status_code == 404


def test_runs_picked_by_query_share_one_plot(get: Any) -> None:
    paths = [f"{NAME}/runs/seed_{s}" for s in (1, 3)]
    page = get("/rcp/compare", params={"path": paths})
    assert page.status_code == 200 and "2 runs compared" in page.text
    svg = get("/rcp/plot/runs.svg", params={"path": paths}).text
    assert 'id="pass4-0"' in svg and 'id="pass4-1"' in svg and 'id="pass4-2"' not in svg
    for path in paths:
        assert path in svg
    assert get("/rcp/plot/runs.svg").status_code == 422


def test_the_run_page_shows_time_to_train(get: Any, storage_root: Path) -> None:
    from rcpflow.records.mllog import read_events, run_start_ms

    log = storage_root / NAME / "runs" / "seed_2" / "mllog" / "seed_2.out"
    events = read_events(str(log))
    (stop,) = [e for e in events if e.key == "run_stop"]
    start = run_start_ms(events)
    assert start is not None
    page = get(f"/rcp/run?path={NAME}/runs/seed_2").text
    assert f"<span id='time-to-train'>{(stop.time_ms - start) / 60000:.3f} min</span>" in page
