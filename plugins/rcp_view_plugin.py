"""The Airflow plugin that adds the "MLPerf RCP" view (see `plugins.rcp_view`)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from plugins.rcp_view import EXTERNAL_VIEWS, FASTAPI_APPS


class RcpViewPlugin(AirflowPlugin):
    name = "rcpflow_rcp_view"
    fastapi_apps = FASTAPI_APPS
    external_views = EXTERNAL_VIEWS
