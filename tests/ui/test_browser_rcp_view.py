"""The RCP view in a real browser: headless Chromium against a private Airflow on 127.0.0.1.

A run is prepared the way a submitter's is: the ``mlperf_grpo_run`` DAG, triggered through the
REST API, runs the real training and evaluation jobs, finalize and the official compliance
checker. Then the browser logs in through Airflow's login form, opens the "MLPerf RCP" entry of
the nav bar and follows the view from the submission to the run and its plot, clicks through to the
DAG run, opens its RCP tab, and reads the evaluate instances' labels in the grid. What the pages
must show is read from the run's own files (manifest, MLLOG, verdict), never written into the
test. Screenshots of every step are kept in the test's temporary folder.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from chromium_driver import chromium, require_browser

from rcpflow.layout import RunLayout
from rcpflow.manifest import load
from rcpflow.mllog import read_events
from tasks.devtools.airflow_server import USER, LocalAirflow, ServerConfig
from tasks.processes import free_port
from tasks.verdicts import read_verdict

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

REPO = Path(__file__).resolve().parents[2]
SUBMISSION = "browser"
RUN_ID = f"{SUBMISSION}__seed_1"  # the id the submission DAG gives its seed-1 run
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


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalAirflow, Path]]:
    """A private Airflow whose storage root holds one run finished by the real DAG."""
    require_browser()
    base = tmp_path_factory.mktemp("rcp-browser")
    root = base / "storage"
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
    run_dir = root / SUBMISSION / "runs" / "seed_1"
    with LocalAirflow(config) as airflow:
        airflow.wait_for_dag("mlperf_grpo_run")
        airflow.trigger("mlperf_grpo_run", {**RUN_CONF, "run_dir": str(run_dir)}, run_id=RUN_ID)
        state = airflow.wait_for_run("mlperf_grpo_run", RUN_ID, timeout_s=720)
        assert state == "success", airflow.task_instances("mlperf_grpo_run", RUN_ID)
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
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition, message=f"waiting for {what}")


def _css(driver: WebDriver, selector: str) -> WebElement:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return _wait(driver, selector, ec.presence_of_element_located((By.CSS_SELECTOR, selector)))


class Shots:
    """Numbered screenshots in the test's temporary folder."""

    def __init__(self, driver: WebDriver, folder: Path) -> None:
        self.driver, self.folder, self.count = driver, folder / "screenshots", 0
        self.folder.mkdir(exist_ok=True)

    def __call__(self, name: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}.png"
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
    """The nav bar's MLPerf RCP entry, then into the iframe the UI shows the view in."""
    from selenium.webdriver.common.by import By

    link = _css(driver, "[data-testid=nav-sidebar] a[href$='plugin/mlperf-rcp']")
    assert link.text.strip() == "MLPerf RCP"
    link.click()
    frame = _css(driver, "iframe[title='MLPerf RCP']")
    driver.switch_to.frame(frame)
    _css(driver, "table#submissions")
    shot("rcp-index")
    row = driver.find_element(By.CSS_SELECTOR, f"tr[data-submission='{SUBMISSION}']")
    row.find_element(By.LINK_TEXT, SUBMISSION).click()
    _css(driver, "table#runs")


def test_unauthenticated_browser_gets_no_data(
    finished_run: tuple[LocalAirflow, Path], browser: WebDriver
) -> None:
    airflow, _ = finished_run
    for route in ("/rcp/", f"/rcp/api/run?path={SUBMISSION}/runs/seed_1"):
        try:
            urllib.request.urlopen(airflow.url + route, timeout=30)
        except urllib.error.HTTPError as exc:
            assert exc.code == 401, route
        else:
            pytest.fail(f"{route} answered without a token")
    browser.get(airflow.url + "/rcp/")
    assert json.loads(_css(browser, "body").text) == {"detail": "Not authenticated"}


def test_rcp_view_follows_the_run(
    finished_run: tuple[LocalAirflow, Path], browser: WebDriver, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    airflow, run_dir = finished_run
    steps, passing = _expected(run_dir)
    compliance = read_verdict(str(run_dir), "compliance_checker")
    assert compliance is not None
    shot = Shots(browser, tmp_path)

    _login(browser, airflow, shot)
    _open_view(browser, shot)
    shot("submission")
    (run_row,) = browser.find_elements(By.CSS_SELECTOR, "table#runs tr[data-seed='1']")
    grid = run_row.find_element(By.LINK_TEXT, RUN_ID)
    assert grid.get_attribute("href") == f"{airflow.url}/dags/mlperf_grpo_run/runs/{RUN_ID}"
    assert grid.get_attribute("data-ui") == "1"
    run_row.find_element(By.LINK_TEXT, f"{SUBMISSION}/runs/seed_1").click()

    table = _css(browser, "table#steps")
    shot("run")
    shown = [
        int(str(r.get_attribute("data-step")))
        for r in table.find_elements(By.CSS_SELECTOR, "tr[data-step]")
    ]
    assert shown == steps
    passed = table.find_elements(By.CSS_SELECTOR, "tr.passed")
    assert [p.get_attribute("data-step") for p in passed] == [str(passing)]
    assert float(passed[0].find_element(By.CSS_SELECTOR, "td.pass4").text) > 0.69
    for row in table.find_elements(By.CSS_SELECTOR, "tr.skip"):
        assert f"skip (step {passing} passed)" in row.text
    assert browser.find_element(By.ID, "outcome").text == f"success: converged at step {passing}"
    assert browser.find_element(By.ID, "compliance").text == compliance.headline()
    assert compliance.ok

    plot = _css(browser, "img#plot")
    _wait(
        browser,
        "the plot to load",
        lambda d: d.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth > 0", plot
        ),
    )
    size = browser.execute_script(
        "return [arguments[0].naturalWidth, arguments[0].naturalHeight]", plot
    )
    assert size == [960, 540]
    png = str(browser.find_element(By.LINK_TEXT, "PNG").get_attribute("href"))

    browser.switch_to.default_content()
    browser.get(png)  # the plot on its own, as "open image in new tab" shows it
    image = _css(browser, "img")
    _wait(
        browser,
        "the PNG",
        lambda d: d.execute_script("return arguments[0].naturalWidth > 0", image),
    )
    size = browser.execute_script(
        "return [arguments[0].naturalWidth, arguments[0].naturalHeight]", image
    )
    assert size == [960, 540]
    shot("plot")


def _expected(run_dir: Path) -> tuple[list[int], int]:
    """The run's checkpoint steps and its passing step, from its manifest and MLLOG."""
    layout = RunLayout(str(run_dir))
    steps = [r.step for r in load(layout.manifest).rows]
    (stop,) = [e for e in read_events(layout.mllog(1)) if e.key == "run_stop"]
    return steps, stop.metadata["samples_count"] // RUN_CONF["global_batch_size"]


def test_grid_labels_every_evaluate_instance_by_its_step(
    finished_run: tuple[LocalAirflow, Path], browser: WebDriver, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    airflow, run_dir = finished_run
    steps, passing = _expected(run_dir)
    assert passing < steps[-1], "the prepared run must leave checkpoints after the pass"
    shot = Shots(browser, tmp_path)
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

    # the grid's list of the mapped evaluate instances
    browser.get(
        f"{airflow.url}/dags/mlperf_grpo_run/runs/{RUN_ID}/tasks/evaluation.evaluate/mapped"
    )
    cells = "td[data-testid=table-cell-rendered_map_index]"
    _wait(
        browser,
        "one row per checkpoint",
        lambda d: len(d.find_elements(By.CSS_SELECTOR, cells)) == len(steps),
    )
    shot("grid-mapped-evaluate")
    table = {}
    for row in browser.find_elements(By.CSS_SELECTOR, "tbody tr"):
        label = row.find_element(By.CSS_SELECTOR, cells).text.strip()
        table[label] = row.find_element(By.CSS_SELECTOR, "td[data-testid=table-cell-state]").text
    assert not [label for label in table if re.fullmatch(r"\d+", label)], table
    assert sorted(table) == sorted(f"step {s}" for s in steps)
    for s in steps:
        assert table[f"step {s}"].lower() == ("success" if s <= passing else "skipped"), table

    # the REST API says the same, and a skipped instance's log names the deciding step
    tis = [
        t
        for t in airflow.task_instances("mlperf_grpo_run", RUN_ID)
        if t["task_id"] == "evaluation.evaluate"
    ]
    assert {t["rendered_map_index"] for t in tis} == {f"step {s}" for s in steps}
    (skipped,) = [t for t in tis if t["rendered_map_index"] == f"step {passing + 1}"]
    log = airflow.task_log("mlperf_grpo_run", RUN_ID, "evaluation.evaluate", skipped["map_index"])
    assert f"step {passing} already passed the target" in log, log[-2000:]
