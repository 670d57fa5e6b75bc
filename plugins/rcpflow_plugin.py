"""The rcpflow Airflow plugin: the "MLPerf RCP" view (`plugins.rcp_view`), a FastAPI app the API
server mounts at ``/rcp`` and its entries in the UI (a top-level nav item, a tab on every DAG
run). Operators and triggers are ordinary modules of `tasks.backends`, not plugin members.

Airflow loads this file in every process that loads plugins, task processes included: it
imports only `plugins.rcp_view`'s constants, the app itself is built on its first request.
"""

from airflow.plugins_manager import AirflowPlugin

from plugins.rcp_view import EXTERNAL_VIEWS, FASTAPI_APPS


class RcpflowPlugin(AirflowPlugin):
    name = "rcpflow"
    fastapi_apps = FASTAPI_APPS
    external_views = EXTERNAL_VIEWS
