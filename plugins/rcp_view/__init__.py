"""The "MLPerf RCP" view of the Airflow UI: submissions, runs, verdicts and the convergence plot.

A FastAPI app the API server mounts (`FASTAPI_APPS`) and its UI entries (`EXTERNAL_VIEWS`), both
handed to `plugins.rcpflow_plugin.RcpflowPlugin`; the app (`plugins.rcp_view.app`) is built on
its first request, so importing this package stays cheap (why: docs/airflow.md, plugins).
"""

from __future__ import annotations

from typing import Any

from plugins.rcp_view.asgi import LazyApp

URL_PREFIX = "/rcp"
NAV_ROUTE = "mlperf-rcp"
DAG_RUN_ROUTE = "mlperf-rcp-run"
NAV_LABEL = "RCP"

FASTAPI_APPS: list[dict[str, Any]] = [
    {
        "app": LazyApp("plugins.rcp_view.app:create_app"),
        "url_prefix": URL_PREFIX,
        "name": "MLPerf RCP",
    }
]

EXTERNAL_VIEWS: list[dict[str, Any]] = [
    # A top-level nav entry: the submissions under the storage root, in an iframe at
    # /plugin/mlperf-rcp. The nav bar cuts a label after about eight characters.
    {
        "name": NAV_LABEL,
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
