"""The "MLPerf RCP" view of the Airflow UI: submissions, runs, verdicts and the convergence plot.

Airflow 3.3's plugin interface has no server-rendered views of its own any more (Flask
AppBuilder views only through the FAB provider); a plugin brings a FastAPI app, which the API
server mounts under its `url_prefix` (``fastapi_apps``), and UI entries (``external_views``:
a nav item, or a tab on a DAG, DAG run or task instance page, each shown in an iframe of the
UI when it has a ``url_route``). This package is both: `FASTAPI_APPS` and `EXTERNAL_VIEWS` go
into `plugins.rcpflow_plugin.RcpflowPlugin`, the app itself is built in `plugins.rcp_view.app`.

Importing this package is cheap (no FastAPI, no matplotlib, no Airflow API modules): Airflow
loads the plugins folder in every task process too (for macros), and the API server is the only
process that ever serves the view, so the app is built on its first request (`LazyApp`).
"""

from __future__ import annotations

from typing import Any

from plugins.rcp_view.asgi import LazyApp

URL_PREFIX = "/rcp"
NAV_ROUTE = "mlperf-rcp"
DAG_RUN_ROUTE = "mlperf-rcp-run"

FASTAPI_APPS: list[dict[str, Any]] = [
    {
        "app": LazyApp("plugins.rcp_view.app:create_app"),
        "url_prefix": URL_PREFIX,
        "name": "MLPerf RCP",
    }
]

EXTERNAL_VIEWS: list[dict[str, Any]] = [
    # A top-level nav entry: the submissions under the storage root, in an iframe at
    # /plugin/mlperf-rcp.
    {
        "name": "MLPerf RCP",
        "href": f"{URL_PREFIX}/",
        "url_route": NAV_ROUTE,
        "destination": "nav",
        "nav_top_level": True,
    },
    # A tab on every DAG run's page: the submission or run that DAG run worked on.
    {
        "name": "RCP",
        "href": f"{URL_PREFIX}/dag-run/{{DAG_ID}}/{{RUN_ID}}",
        "url_route": DAG_RUN_ROUTE,
        "destination": "dag_run",
    },
]
