"""The RCP view in a real browser: headless Chromium against a private Airflow on 127.0.0.1.

A run is prepared the way a submitter's is: the ``mlperf_grpo_run`` DAG, triggered through the
REST API, runs the real training and evaluation jobs, finalize and the official compliance
checker; beside it, under the same storage root, a three-seed submission built by the real
writers and judged by the official compliance and RCP checkers (tests/synthetic_run.py), its
report written by the report task's code, and a second standalone run. The browser logs in
through Airflow's login form, opens the "RCP" entry of the nav bar and follows the view: the
index (submissions and standalone runs apart), the trained run (its checkpoints, time to train,
training reward, the plot with its skipped steps marked on the step axis, the wall-clock view),
the submission (the RCP checker's numbers, the seeds' plot, report.html as a page), two runs
compared on one plot, the DAG run, its RCP tab, and the evaluate instances' labels in the grid.
What the pages must show is read from the runs' own files (manifest, MLLOG, verdicts), never
written into the test. Screenshots of every page are kept in one folder under the test's
temporary directory (its path is printed).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from chromium_driver import chromium, require_browser

from devtools.servers.airflow_server import USER, LocalAirflow, ServerConfig
from devtools.synthetic_run import make_run
from rcpflow import recipe
from rcpflow.files.layout import RunLayout
from rcpflow.records.manifest import load
from rcpflow.records.mllog import read_events, run_start_ms
from rcpflow.records.rcp_reference import reference_means
from rcpflow.submission import checkers
from rcpflow.submission.package import SystemDescription, package_submission
from rcpflow.verdict.finalize import finalize
from tasks.jobs.processes import free_port
from tasks.results.verdicts import read_verdict, record
from tasks.submission.report import write_report
from tasks.submission.spec import SubmissionSpec

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

REPO = Path(__file__).resolve().parents[2]
TRAINED = "browser/runs/seed_1"  # the run the real DAG trains: a standalone run
RUN_ID = "browser__seed_1"
SYNTH = "synth"  # the synthetic three-seed submission
SYNTH_CONVERGES_AT = {1: 20, 2: 19, 3: 22}
SOLO = "solo"  # a second standalone run, to compare with
# The toy converges a few checkpoints after the recipe's validation start of 18 at gbs 256.
RUN_CONF = {
    "seed": 1,
    "global_batch_size": 256,
    "max_steps": 28,
    "val_start_at": 18,
    "division": "open",
}
WAIT_S = 60

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _synthetic_submission(root: Path) -> None:
    """Three finalized closed-division seeds, each judged by the compliance checker, packaged
    and judged by the RCP checker, with the report the report task writes."""
    spec = SubmissionSpec(
        name=SYNTH, out_dir=str(root / SYNTH), seeds=tuple(SYNTH_CONVERGES_AT),
        global_batch_size=256, max_steps=24, val_start_at=None, target=0.69,
        division="closed", backend="local", system={},
    )  # fmt: skip
    work = str(root / SYNTH / "tmp")
    for seed, step in SYNTH_CONVERGES_AT.items():
        accuracies = {s: (0.75 if s == step else 0.45 + 0.01 * s) for s in range(18, step + 1)}
        run = make_run(spec.run_dir(seed), seed=seed, accuracies=accuracies)
        assert finalize(run.run_dir).status == "success"
        log = run.layout.mllog(seed)
        record(checkers.compliance(log, "closed", work), log, run.run_dir)
    org = package_submission(
        [spec.run_dir(s) for s in spec.seeds], list(spec.seeds), spec.out_dir,
        SystemDescription(),
    )  # fmt: skip
    results = str(Path(org) / "results" / "rcpflow-local-cpu" / recipe.BENCHMARK)
    record(checkers.rcp(results, work), results, spec.out_dir)
    write_report(spec)
    solo = make_run(str(root / SOLO), accuracies={18: 0.6, 19: 0.65, 20: 0.71})
    finalize(solo.run_dir)


@pytest.fixture(scope="module")
def shots_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rcp-browser-screenshots")
    print(f"screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalAirflow, Path]]:
    """A private Airflow whose storage root holds one run finished by the real DAG, a
    synthetic submission and a second standalone run."""
    require_browser()
    base = tmp_path_factory.mktemp("rcp-browser")
    root = base / "storage"
    _synthetic_submission(root)
    deployment = base / "deployment.toml"
    deployment.write_text(f'storage_root = "{root}"\n\n[job_env]\nJAX_PLATFORMS = "cpu"\n')
    config = ServerConfig(
        home=base / "airflow",
        dags_folder=REPO / "dags",
        plugins_folder=REPO / "plugins",
        port=free_port(),
        parallelism=2,
        env={"JAX_PLATFORMS": "cpu", "RCPFLOW_DEPLOYMENT": str(deployment)},
    )
    run_dir = root / TRAINED
    with LocalAirflow(config) as airflow:
        airflow.wait_for_dag("mlperf_grpo_run")
        airflow.trigger("mlperf_grpo_run", {**RUN_CONF, "run_dir": str(run_dir)}, run_id=RUN_ID)
        state = airflow.wait_for_run("mlperf_grpo_run", RUN_ID, timeout_s=720)
        assert state == "success", airflow.failure_report("mlperf_grpo_run", RUN_ID)
        yield airflow, run_dir


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    require_browser()
    driver = chromium(tmp_path / "chromium-profile")
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: WebDriver, what: str, condition: Any) -> Any:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def looked(d: WebDriver) -> Any:
        try:
            return condition(d)
        except WebDriverException as e:
            # The UI's redirect (to the login page, after it) navigated while we looked:
            # chromium aborts the lookup; the next look sees the new page.
            if "aborted by navigation" in str(e.msg):
                return False
            raise

    return WebDriverWait(driver, WAIT_S).until(looked, message=f"waiting for {what}")


def _css(driver: WebDriver, selector: str) -> WebElement:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return _wait(driver, selector, ec.presence_of_element_located((By.CSS_SELECTOR, selector)))


class Shots:
    """Numbered screenshots, one folder for the module, named by test and page."""

    def __init__(self, driver: WebDriver, folder: Path, test: str) -> None:
        self.driver, self.folder, self.test, self.count = driver, folder, test, 0

    def __call__(self, name: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.test}-{self.count:02d}-{name}.png"
        assert self.driver.save_screenshot(str(path)), path
        return path


def _login(driver: WebDriver, airflow: LocalAirflow, shot: Shots) -> None:
    from selenium.webdriver.common.by import By

    driver.get(airflow.url + "/")
    _css(driver, "input[name=username]").send_keys(USER)
    driver.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(airflow.password)
    shot("login-form")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _css(driver, "[data-testid=nav-sidebar]")
    assert "_token" in {c["name"] for c in driver.get_cookies()}
    shot("logged-in")


def _open_view(driver: WebDriver, shot: Shots) -> None:
    """The nav bar's RCP entry (its label whole, not cut), then into the view's iframe: the
    index, with the submission under submissions and the trained run under the runs."""
    from selenium.webdriver.common.by import By

    link = _css(driver, "[data-testid=nav-sidebar] a[href$='plugin/mlperf-rcp']")
    assert link.text.strip() == "RCP"
    assert "..." not in link.text and "\u2026" not in link.text
    link.click()
    frame = _css(driver, "iframe[title='RCP']")
    driver.switch_to.frame(frame)
    _css(driver, "table#submissions")
    shot("rcp-index")
    submissions = driver.find_elements(By.CSS_SELECTOR, "table#submissions tr[data-submission]")
    assert [r.get_attribute("data-submission") for r in submissions] == [SYNTH]
    runs = driver.find_elements(By.CSS_SELECTOR, "table#standalone-runs tr[data-run]")
    assert sorted(str(r.get_attribute("data-run")) for r in runs) == sorted([TRAINED, SOLO])


def _image_loaded(driver: WebDriver, selector: str) -> list[int]:
    """Wait for the <img> to load; its natural size."""
    image = _css(driver, selector)
    _wait(
        driver,
        f"{selector} to load",
        lambda d: d.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth > 0", image
        ),
    )
    return list(
        driver.execute_script(
            "return [arguments[0].naturalWidth, arguments[0].naturalHeight]", image
        )
    )


def _svg_text(driver: WebDriver, img_selector: str) -> str:
    """The SVG twin of a plot <img>, fetched by the page itself (same cookies); matplotlib
    draws text as paths and names it in a comment beside them."""
    src = str(_css(driver, img_selector).get_attribute("src")).replace(".png?", ".svg?")
    return str(
        driver.execute_async_script(
            "var done = arguments[1]; fetch(arguments[0]).then(r => r.text()).then(done);", src
        )
    )


def _svg_of(driver: WebDriver, img_selector: str) -> ET.Element:
    return ET.fromstring(_svg_text(driver, img_selector))


def _marks(svg: ET.Element, gid: str) -> list[tuple[float, float]]:
    groups = [g for g in svg.iter() if g.attrib.get("id") == gid]
    if not groups:
        return []
    return [
        (float(u.attrib["x"]), float(u.attrib["y"])) for u in groups[0].iter() if "x" in u.attrib
    ]


def test_unauthenticated_browser_gets_no_data(
    finished_run: tuple[LocalAirflow, Path], browser: WebDriver
) -> None:
    airflow, _ = finished_run
    for route in ("/rcp/", f"/rcp/api/run?path={TRAINED}"):
        try:
            urllib.request.urlopen(airflow.url + route, timeout=30)
        except urllib.error.HTTPError as exc:
            assert exc.code == 401, route
        else:
            pytest.fail(f"{route} answered without a token")
    browser.get(airflow.url + "/rcp/")
    assert json.loads(_css(browser, "body").text) == {"detail": "Not authenticated"}


def _expected(run_dir: Path, seed: int = 1) -> tuple[list[int], int, float]:
    """The run's checkpoint steps, its passing step and its minutes to train, from its
    manifest and MLLOG."""
    layout = RunLayout(str(run_dir))
    steps = [r.step for r in load(layout.manifest).rows]
    events = read_events(layout.mllog(seed))
    (stop,) = [e for e in events if e.key == "run_stop"]
    start = run_start_ms(events)
    assert start is not None
    gbs = load(layout.manifest).rows[0].global_batch_size
    return steps, stop.metadata["samples_count"] // gbs, (stop.time_ms - start) / 60000


def test_rcp_view_follows_the_run(
    finished_run: tuple[LocalAirflow, Path], browser: WebDriver, shots_dir: Path
) -> None:
    from selenium.webdriver.common.by import By

    airflow, run_dir = finished_run
    steps, passing, minutes = _expected(run_dir)
    compliance = read_verdict(str(run_dir), "compliance_checker")
    assert compliance is not None
    shot = Shots(browser, shots_dir, "run")

    _login(browser, airflow, shot)
    _open_view(browser, shot)
    (run_row,) = browser.find_elements(By.CSS_SELECTOR, f"tr[data-run='{TRAINED}']")
    assert "checks not run yet" not in run_row.text  # a run, not a pending submission
    grid = run_row.find_element(By.LINK_TEXT, RUN_ID)
    assert grid.get_attribute("href") == f"{airflow.url}/dags/mlperf_grpo_run/runs/{RUN_ID}"
    assert grid.get_attribute("data-ui") == "1"
    run_row.find_element(By.LINK_TEXT, TRAINED).click()

    table = _css(browser, "table#steps")
    shot("run-page")
    shown = [
        int(str(r.get_attribute("data-step")))
        for r in table.find_elements(By.CSS_SELECTOR, "tr[data-step]")
    ]
    assert shown == steps
    passed = table.find_elements(By.CSS_SELECTOR, "tr.passed")
    assert [p.get_attribute("data-step") for p in passed] == [str(passing)]
    assert float(passed[0].find_element(By.CSS_SELECTOR, "td.pass4").text) > 0.69
    skipped_rows = table.find_elements(By.CSS_SELECTOR, "tr.skip")
    for row in skipped_rows:
        assert f"skip (step {passing} passed)" in row.text
    assert browser.find_element(By.ID, "outcome").text == f"success: converged at step {passing}"
    assert browser.find_element(By.ID, "time-to-train").text == f"{minutes:.3f} min"
    assert browser.find_element(By.ID, "compliance").text == compliance.headline()
    assert compliance.ok
    # the toy trainer prints reward and loss per update; the view reads them from its task log
    trained = RUN_CONF["max_steps"]
    assert browser.find_element(By.ID, "training").text == (
        f"{trained} training steps with reward/loss"
    )

    assert _image_loaded(browser, "img#plot") == [960, 540]
    assert _image_loaded(browser, "img#plot-time") == [960, 540]
    browser.execute_script("document.getElementById('plot').scrollIntoView()")
    shot("run-plots")
    svg = _svg_of(browser, "img#plot")
    scores, marks = _marks(svg, "pass4-0"), _marks(svg, "skipped-0")
    evaluated = len(steps) - len(skipped_rows)
    assert len(scores) == evaluated and len(marks) == len(skipped_rows) > 0
    # skipped steps sit along the step axis, below every score: marks, not values
    assert min(y for _, y in marks) > max(y for _, y in scores)
    assert any(g.attrib.get("id") == "reward-0" for g in svg.iter())  # the reward beneath
    time_svg = _svg_of(browser, "img#plot-time")
    assert len(_marks(time_svg, "pass4-0")) == evaluated
    png = str(browser.find_element(By.LINK_TEXT, "PNG").get_attribute("href"))

    browser.switch_to.default_content()
    browser.get(png)  # the plot on its own, as "open image in new tab" shows it
    assert _image_loaded(browser, "img") == [960, 540]
    shot("plot-png")


def test_the_submission_shows_the_rcp_numbers_its_plot_and_report(
    finished_run: tuple[LocalAirflow, Path], browser: WebDriver, shots_dir: Path
) -> None:
    from selenium.webdriver.common.by import By

    airflow, run_dir = finished_run
    root = run_dir.parents[2]
    shot = Shots(browser, shots_dir, "submission")
    samples = {}
    for seed in SYNTH_CONVERGES_AT:
        _, step, _ = _expected(root / SYNTH / "runs" / f"seed_{seed}", seed)
        samples[seed] = step * 256
    middle = sorted(samples, key=samples.__getitem__)[1]
    mean = reference_means()[256]
    rcp = read_verdict(str(root / SYNTH), "rcp_checker")
    assert rcp is not None

    _login(browser, airflow, shot)
    _open_view(browser, shot)
    browser.find_element(By.LINK_TEXT, SYNTH).click()
    numbers = _css(browser, "table#rcp-numbers")
    shot("submission-page")

    def cell(key: str) -> str:
        return numbers.find_element(By.CSS_SELECTOR, f"tr[data-rcp='{key}'] td").text

    assert cell("reference-mean") == f"{mean:.0f} samples"
    assert cell("min-allowed").endswith(" samples")
    assert cell("submission-mean") == f"{samples[middle]} samples"
    assert cell("scored-seeds").startswith(f"{middle} (dropped, fastest and slowest: ")
    for seed, n in samples.items():
        assert f"seed {seed}: {n} samples" in cell("samples")
    assert cell("why").startswith("passes: " if rcp.ok else "fails: ")
    checker = browser.find_element(By.CSS_SELECTOR, "table#checkers tr[data-tool='rcp_checker']")
    assert rcp.headline() in checker.text

    # the seeds on one plot
    assert _image_loaded(browser, "img#plot") == [960, 540]
    svg = _svg_of(browser, "img#plot")
    for i in range(len(SYNTH_CONVERGES_AT)):
        assert _marks(svg, f"pass4-{i}"), i
    browser.execute_script("document.getElementById('plot').scrollIntoView()")
    shot("submission-plot")

    # report.html, as a page
    browser.find_element(By.LINK_TEXT, "report.html").click()
    heading = _css(browser, "h1")
    assert heading.text == f"{recipe.BENCHMARK} submission {SYNTH}"
    assert _css(browser, "figure#convergence svg") is not None
    shot("report-html")


def test_two_runs_compared_on_one_plot(
    finished_run: tuple[LocalAirflow, Path], browser: WebDriver, shots_dir: Path
) -> None:
    from selenium.webdriver.common.by import By

    airflow, _ = finished_run
    shot = Shots(browser, shots_dir, "compare")
    _login(browser, airflow, shot)
    _open_view(browser, shot)
    for path in (TRAINED, SOLO):
        row = browser.find_element(By.CSS_SELECTOR, f"tr[data-run='{path}']")
        row.find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    browser.find_element(By.CSS_SELECTOR, "#compare-form button[type=submit]").click()
    rows = _css(browser, "table#compared").find_elements(By.CSS_SELECTOR, "tr[data-run]")
    assert [r.get_attribute("data-run") for r in rows] == [TRAINED, SOLO]
    assert _image_loaded(browser, "img#plot") == [960, 540]
    text = _svg_text(browser, "img#plot")
    svg = ET.fromstring(text)
    assert _marks(svg, "pass4-0") and _marks(svg, "pass4-1")
    assert f"<!-- {TRAINED} -->" in text and f"<!-- {SOLO} -->" in text  # the legend
    shot("compare-page")


def test_grid_labels_every_evaluate_instance_by_its_step(
    finished_run: tuple[LocalAirflow, Path], browser: WebDriver, shots_dir: Path
) -> None:
    from selenium.webdriver.common.by import By

    airflow, run_dir = finished_run
    steps, passing, _ = _expected(run_dir)
    assert passing < steps[-1], "the prepared run must leave checkpoints after the pass"
    shot = Shots(browser, shots_dir, "grid")
    _login(browser, airflow, shot)

    # from the view's run table to the DAG run, in the top window
    _open_view(browser, shot)
    browser.find_element(By.LINK_TEXT, RUN_ID).click()
    browser.switch_to.default_content()
    _wait(browser, "the DAG run page", lambda d: d.current_url.endswith(f"/runs/{RUN_ID}"))
    shot("dag-run")

    # the DAG run's RCP tab: the view of the run it worked on
    browser.get(f"{airflow.url}/dags/mlperf_grpo_run/runs/{RUN_ID}/plugin/mlperf-rcp-run")
    browser.switch_to.frame(_css(browser, "iframe[title='RCP']"))
    rows = _css(browser, "table#steps").find_elements(By.CSS_SELECTOR, "tr[data-step]")
    assert [int(str(r.get_attribute("data-step"))) for r in rows] == steps
    browser.switch_to.default_content()
    shot("dag-run-rcp-tab")

    # the grid's list of the mapped evaluate instances: those that ran are labelled "step N";
    # those above the pass were skipped by the scheduler without a task process, and Airflow 3.3
    # renders no label for an instance that never ran (docs/ui.md, "Labels"): the bare map index
    evaluate = "evaluation.checkpoint.evaluate"
    # what the grid renders, from the REST API it reads
    tis = [t for t in airflow.task_instances("mlperf_grpo_run", RUN_ID) if t["task_id"] == evaluate]
    ran = {t["rendered_map_index"] for t in tis if t["state"] == "success"}
    assert ran == {f"step {s}" for s in steps if s <= passing}
    assert {t["state"] for t in tis if t["rendered_map_index"] not in ran} == {"skipped"}
