"""The RCP view over a storage root a careless or hostile user filled: every page answers with
what it can read and names what it cannot, never a 500; nothing outside the root is served;
standalone runs are runs, not submissions. Mounted by Airflow's own API app, behind its auth.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.synthetic_run import make_run
from rcpflow.verdict.finalize import finalize
from tasks.results.verdicts import Verdict

pytestmark = pytest.mark.timeout(300)

SUB = "good"
OUTSIDE_SECRET = "outside-the-root-secret"


def _verdict(folder: Path, tool: str, ok: bool = True) -> None:
    verdict = Verdict(tool, ok, str(folder), (), 0, "", "")
    (folder / "checks").mkdir(parents=True, exist_ok=True)
    (folder / "checks" / f"{tool}.json").write_text(verdict.to_json())


def _edit_mllog(path: Path, key: str, edit: Any) -> None:
    lines = []
    for line in path.read_text().splitlines():
        if f'"key": "{key}"' in line:
            prefix, body = line.split(":::MLLOG ", 1)
            record = json.loads(body)
            edit(record)
            line = f"{prefix}:::MLLOG {json.dumps(record)}"
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")


def _edit_manifest(run_dir: Path, step: int, **fields: Any) -> None:
    manifest = run_dir / "mllog" / "eval_checkpoints.jsonl"
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    for row in rows:
        if row["step"] == step or step < 0:
            row.update(fields)
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("hostile")
    root = base / "storage"
    outside = base / "outside"
    outside.mkdir()
    (outside / "summary.json").write_text(json.dumps({"secret": OUTSIDE_SECRET}))
    # a submission (the submission DAG's checks/ are there) with one seed
    good = make_run(str(root / SUB / "runs" / "seed_1"), accuracies={18: 0.5, 19: 0.8})
    finalize(good.run_dir)
    _verdict(root / SUB, "package_checker")
    # a standalone run laid out like a submission's seed, no submission DAG behind it
    make_run(str(root / "solo" / "runs" / "seed_1"), accuracies={18: 0.75})
    # an aborted standalone run deeper down: every checkpoint evaluated, none passed
    aborted = make_run(
        str(root / "experiments" / "aborted"), accuracies={s: 0.5 for s in range(18, 25)}
    )
    assert finalize(aborted.run_dir).status == "aborted"
    # the schedule its plan recorded, and an unreadable record
    from rcpflow.files.layout import RunLayout
    from rcpflow.verdict.schedule_record import ScheduleRecord, record_schedule

    record_schedule(aborted.run_dir, ScheduleRecord(eval_schedule="during_training", eval_window=3))
    Path(RunLayout(good.run_dir).eval_schedule).write_text("{")
    # names the view cannot serve
    for name in ("my sub", "a<b"):
        make_run(str(root / name / "runs" / "seed_1"))
    # a summary symlinked to a file outside the root
    linked = make_run(str(root / "linked"), accuracies={18: 0.5})
    summary = Path(linked.layout.summary(18))
    summary.unlink()
    summary.symlink_to(outside / "summary.json")
    # a run folder that is itself a symlink out of the root
    make_run(str(outside / "run"), accuracies={18: 0.5})
    (root / "escape").symlink_to(outside / "run")
    # run_stop without samples_count
    nosamples = make_run(str(root / "nosamples"), accuracies={18: 0.8})
    finalize(nosamples.run_dir)
    _edit_mllog(nosamples.log_file, "run_stop", lambda r: r["metadata"].pop("samples_count"))
    # a truncated checker verdict of a submission
    trunc = root / "truncated"
    make_run(str(trunc / "runs" / "seed_1"))
    _verdict(trunc, "rcp_checker")
    text = (trunc / "checks" / "rcp_checker.json").read_text()
    (trunc / "checks" / "rcp_checker.json").write_text(text[: len(text) // 2])
    # a weight-update time no date can hold (the last row's, which `manifest validate` accepts)
    future = make_run(str(root / "future"), accuracies={18: 0.5})
    _edit_manifest(Path(future.run_dir), 24, timestamp_ms=10**16)
    # checkpoints on gs:// while this server has no Google credentials
    cloud = make_run(str(root / "cloud"))
    _edit_manifest(Path(cloud.run_dir), -1, checkpoint_path="gs://no-such-bucket/ckpt")
    return root


@pytest.fixture(scope="module")
def client(airflow_db: str, root: Path, tmp_path_factory: pytest.TempPathFactory):
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    deployment = tmp_path_factory.mktemp("deployment") / "deployment.toml"
    deployment.write_text(f'storage_root = "{root}"\n')
    empty = tmp_path_factory.mktemp("gcloud")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RCPFLOW_DEPLOYMENT", str(deployment))
        for var in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST"):
            mp.delenv(var, raising=False)
        mp.setenv("CLOUDSDK_CONFIG", str(empty))  # no gcloud login either
        mp.setenv("NO_GCE_CHECK", "true")  # and no metadata server to ask
        yield TestClient(create_app(), raise_server_exceptions=False)


@pytest.fixture
def get(client: Any) -> Iterator[Any]:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="v", role="viewer"))

    def _get(url: str, **kw: Any) -> Any:
        return client.get(url, headers={"Authorization": f"Bearer {token}"}, **kw)

    yield _get


def test_standalone_runs_are_runs_and_submissions_are_submissions(get: Any) -> None:
    body = get("/rcp/api/submissions").json()
    assert [s["name"] for s in body["submissions"]] == [SUB, "truncated"]
    runs = {r["path"] for r in body["runs"]}
    assert {"solo/runs/seed_1", "experiments/aborted", "nosamples", "future"} <= runs
    page = get("/rcp/")
    assert page.status_code == 200
    assert "checks not run yet" not in page.text.split("Runs outside a submission")[1]
    assert "data-run='solo/runs/seed_1'" in page.text


def test_an_aborted_run_says_no_checkpoint_reached_the_target(get: Any) -> None:
    page = get("/rcp/run?path=experiments/aborted").text
    assert "aborted: no checkpoint reached the target by step 24" in page
    assert "aborted: no checkpoint reached the target by step 24" in get("/rcp/").text


def test_folder_names_the_view_cannot_serve_are_skipped_not_a_500(get: Any) -> None:
    page = get("/rcp/")
    assert page.status_code == 200
    assert "&#x27;my sub&#x27;: a name the view cannot serve" in page.text
    assert "a&lt;b" in page.text and "a<b" not in page.text
    assert get("/rcp/api/submissions").status_code == 200


def test_a_summary_symlinked_out_of_the_root_is_not_served(get: Any) -> None:
    answer = get("/rcp/file/summary?path=linked&step=18")
    assert answer.status_code == 404 and "links out of the storage root" in answer.text
    assert OUTSIDE_SECRET not in answer.text


def test_a_run_folder_symlinked_out_of_the_root_is_not_shown(get: Any) -> None:
    answer = get("/rcp/run?path=escape")
    assert answer.status_code == 404 and "symlink out" in answer.text
    assert "escape: a symlink out of the storage root" in get("/rcp/").text
    assert get("/rcp/file/mllog?path=escape").status_code == 404


@pytest.mark.parametrize(
    ("url", "named", "still_served"),
    [
        pytest.param(
            "/rcp/run?path=nosamples",
            ["run_stop in the MLLOG has no samples_count", "success: converged at step ?"],
            [],
            id="run-stop-without-samples-count",
        ),
        pytest.param(
            "/rcp/submission?name=truncated",
            ["checks/rcp_checker.json: not JSON", "UNREADABLE"],
            ["/rcp/"],
            id="truncated-checker-verdict",
        ),
        pytest.param(
            # the manifest reader refuses times more than a day ahead (rcpflow.recipe.time_problem)
            "/rcp/run?path=future",
            ["timestamp_ms 10000000000000000 is more than a day ahead of now"],
            ["/rcp/plot/run.png?path=future", "/rcp/plot/run.png?path=future&view=time"],
            id="timestamp-far-ahead",
        ),
        pytest.param(
            "/rcp/run?path=cloud",
            ["no Google Cloud credentials"],
            ["/rcp/api/run?path=cloud"],
            id="gs-without-credentials",
        ),
    ],
)
def test_a_damaged_input_is_a_page_naming_it(
    get: Any, url: str, named: list[str], still_served: list[str]
) -> None:
    page = get(url)
    assert page.status_code == 200
    for text in named:
        assert text in page.text
    for other in still_served:
        assert get(other).status_code == 200


@pytest.mark.parametrize("route", ["/rcp/openapi.json", "/rcp/docs", "/rcp/redoc"])
def test_the_api_docs_are_off(client: Any, get: Any, route: str) -> None:
    assert client.get(route).status_code in (401, 404)
    answer = get(route)
    assert answer.status_code == 404 and "openapi" not in answer.text.lower()


def test_the_view_reads_each_file_once_per_page(get: Any, monkeypatch: Any) -> None:
    """Linear in rows: the run page reads the manifest and each summary a bounded number of
    times, whatever the number of rows (rcpflow.cli.status's own reads counted with ours)."""
    from rcpflow.files import storage

    opened: list[str] = []
    real = storage.LocalStorage.read_bytes

    def counting(self: Any, path: str) -> bytes:
        opened.append(path)
        return real(self, path)

    monkeypatch.setattr(storage.LocalStorage, "read_bytes", counting)
    assert get(f"/rcp/run?path={SUB}/runs/seed_1").status_code == 200
    manifest_reads = sum(p.endswith("eval_checkpoints.jsonl") for p in opened)
    assert manifest_reads <= 3, manifest_reads


def test_the_run_page_says_which_schedule_the_run_used_and_what_the_rules_say(get: Any) -> None:
    page = get("/rcp/run?path=experiments/aborted")
    assert page.status_code == 200
    assert "during_training: " in page.text and "not described by the rules" in page.text
    assert "W = 3" in page.text
    broken = get(f"/rcp/run?path={SUB}/runs/seed_1")
    assert broken.status_code == 200 and "unreadable schedule record" in broken.text
    solo = get("/rcp/run?path=solo/runs/seed_1")
    assert "not recorded in the run folder" in solo.text
