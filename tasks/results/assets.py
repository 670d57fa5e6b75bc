"""What the run and submission tasks leave on storage, published as Airflow asset events.

A task that writes a file a submitter reads (finalize: the MLLOG; check: the compliance
verdict; report: report.md and report.html) declares an asset alias as its outlet and, once the
file is written, adds an event for the file's asset (``file://`` or ``gs://`` URI). Airflow 3.3
shows those on the DAG run's and the task's "Asset Events" and on the Assets page; each event's
extra names the RCP view page (`plugins.rcp_view`) that shows the file in context. The alias
is static (DAG files stay cheap); the asset's URI is the run's own, known only when it runs.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from airflow.sdk import Asset, AssetAlias, get_current_context

from rcpflow.files.layout import is_gcs

MLLOG = AssetAlias("rcpflow-mllog")
COMPLIANCE = AssetAlias("rcpflow-compliance-verdict")
REPORT = AssetAlias("rcpflow-report")
VIEW_PREFIX = "/rcp"  # where the plugin mounts the RCP view (plugins.rcp_view.URL_PREFIX)


def asset_uri(path: str) -> str:
    return path if is_gcs(path) else "file://" + quote(os.path.abspath(path))


def view_of_this_dag_run() -> str:
    """The RCP view's page for the DAG run this task belongs to."""
    ti = get_current_context()["ti"]
    return f"{VIEW_PREFIX}/dag-run/{quote(ti.dag_id, safe='')}/{quote(ti.run_id, safe='')}"


def publish(alias: AssetAlias, path: str, **extra: str | int | float | bool | None) -> None:
    """An event for the file at `path` through `alias` (one of the task's outlets)."""
    events = get_current_context()["outlet_events"]
    events[alias].add(Asset(asset_uri(path)), extra={"rcp_view": view_of_this_dag_run(), **extra})
