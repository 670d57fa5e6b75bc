"""`JobSetTrigger`: follow a JobSet on the triggerer until it is terminal.

Every read and delete goes through `tasks.backends.gke.hooks.AsyncJobSetHook`, imported on the
first call, so importing this module stays cheap.

API trouble (apiserver restarts, a control-plane upgrade, network loss) is ridden out with
exponential backoff for a time budget (default 20 minutes) before the watch gives up; giving
up is an ``error`` event, which fails the task *with* retries, and a retry adopts the JobSet.
Time spent suspended (waiting for Kueue to admit the JobSet) is bounded on its own and does
not count against the job's running time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from rcpflow.stop_request import current
from tasks.backends.gke.status import (
    JobSetGone,
    JobSetStatusError,
    failed_pods,
    interpret_status,
)

if TYPE_CHECKING:
    from tasks.backends.gke.hooks import AsyncJobSetHook

# The clock and the sleep of the watch loop; a test replaces both with a simulated clock to
# run a long outage in no time through the real loop.
_monotonic = time.monotonic
_sleep = asyncio.sleep


# Reasons of a Failed event for a JobSet the watch gave up on (the cluster has not failed it).
SUSPENDED_TOO_LONG = "SuspendedTooLong"
RUNNING_TOO_LONG = "RunningTooLong"
WATCH_BOUNDS = (SUSPENDED_TOO_LONG, RUNNING_TOO_LONG)


class JobSetTrigger(BaseTrigger):
    """Poll a JobSet every `poll_interval_s` until it is terminal; one event:
    ``{"phase": "Succeeded"|"Failed"|"error", "name", "namespace", "reason", "message",
    "progress", "pods"}`` (`pods`: lines on the failed pods, for a Failed JobSet).

    A JobSet that disappears is Failed (reason NotFound). Failed reads are retried, the wait
    doubling from `poll_interval_s` up to `api_backoff_max_s`, until they have failed for
    `api_error_budget_s` without a good read in between: then ``error``. A malformed status is
    ``error`` at once. Suspended for `max_suspended_s` in a row: Failed (reason
    SuspendedTooLong); running (not suspended) for `max_running_s` in all: Failed (reason
    RunningTooLong). None: no bound.

    With `stop_run_dir` (training under evaluation during training), a JobSet still running
    `stop_grace_s` after a stop request of that run appeared (`rcpflow.stop_request.current`)
    is deleted: phase ``Stopped``."""

    def __init__(
        self,
        *,
        name: str,
        namespace: str,
        cluster_url: str,
        ssl_ca_cert: str,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | Sequence[str] | None = None,
        use_dns_endpoint: bool = False,
        poll_interval_s: float = 30.0,
        api_error_budget_s: float = 1200.0,
        api_backoff_max_s: float = 120.0,
        max_suspended_s: float | None = None,
        max_running_s: float | None = None,
        stop_run_dir: str | None = None,
        stop_grace_s: float = 600.0,
    ) -> None:
        super().__init__()
        self.name = name
        self.namespace = namespace
        self.cluster_url = cluster_url
        self.ssl_ca_cert = ssl_ca_cert
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.use_dns_endpoint = use_dns_endpoint
        self.poll_interval_s = poll_interval_s
        self.api_error_budget_s = api_error_budget_s
        self.api_backoff_max_s = api_backoff_max_s
        self.max_suspended_s = max_suspended_s
        self.max_running_s = max_running_s
        self.stop_run_dir = stop_run_dir
        self.stop_grace_s = stop_grace_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # This module's path; plugins.jobset keeps the path of older releases importable.
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "name": self.name,
                "namespace": self.namespace,
                "cluster_url": self.cluster_url,
                "ssl_ca_cert": self.ssl_ca_cert,
                "gcp_conn_id": self.gcp_conn_id,
                "impersonation_chain": self.impersonation_chain,
                "use_dns_endpoint": self.use_dns_endpoint,
                "poll_interval_s": self.poll_interval_s,
                "api_error_budget_s": self.api_error_budget_s,
                "api_backoff_max_s": self.api_backoff_max_s,
                "max_suspended_s": self.max_suspended_s,
                "max_running_s": self.max_running_s,
                "stop_run_dir": self.stop_run_dir,
                "stop_grace_s": self.stop_grace_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        where = f"JobSet {self.namespace}/{self.name}"
        errors = 0
        failing_since: float | None = None
        suspended_since: float | None = None
        running_s = 0.0
        running_read: float | None = None  # the previous read, if it saw the JobSet running
        last_line = None
        stop_seen: float | None = None
        while True:
            try:
                jobset = await self.read_jobset()
            except JobSetGone as exc:
                yield TriggerEvent(self._event("Failed", reason="NotFound", message=str(exc)))
                return
            except Exception as exc:
                now = _monotonic()
                errors += 1
                failing_since = now if failing_since is None else failing_since
                down_s = now - failing_since
                self.log.warning(
                    "%s: read %d failed (API failing for %.0fs of %.0fs): %r",
                    where, errors, down_s, self.api_error_budget_s, exc,
                )  # fmt: skip
                if down_s >= self.api_error_budget_s:
                    message = (
                        f"the Kubernetes API failed {errors} reads in a row over {down_s:.0f}s "
                        f"(budget {self.api_error_budget_s:.0f}s), last: {exc!r}"
                    )
                    yield TriggerEvent(self._event("error", message=message))
                    return
                backoff = min(self.api_backoff_max_s, self.poll_interval_s * 2 ** (errors - 1))
                # The last wait ends at the budget, so giving up is neither early nor late.
                await _sleep(min(backoff, self.api_error_budget_s - down_s))
                continue
            now = _monotonic()
            errors, failing_since = 0, None
            try:
                status = interpret_status(jobset)
            except JobSetStatusError as exc:
                yield TriggerEvent(self._event("error", message=f"unreadable status: {exc}"))
                return
            line = status.describe()
            if line != last_line:
                self.log.info("%s: %s", where, line)
                last_line = line
            if status.terminal:
                pods = await self._failed_pod_lines() if status.phase == "Failed" else []
                yield TriggerEvent(
                    self._event(
                        status.phase,
                        reason=status.reason,
                        message=status.message,
                        progress=status.progress,
                        pods=pods,
                    )
                )
                return
            if status.suspended:
                running_read = None
                suspended_since = now if suspended_since is None else suspended_since
                if (
                    self.max_suspended_s is not None
                    and now - suspended_since >= self.max_suspended_s
                ):
                    message = (
                        f"suspended (not admitted) for {now - suspended_since:.0f}s, the bound "
                        f"is {self.max_suspended_s:.0f}s: {status.message}"
                    )
                    yield TriggerEvent(
                        self._event(
                            "Failed",
                            reason=SUSPENDED_TOO_LONG,
                            message=message,
                            progress=status.progress,
                        )
                    )
                    return
            else:
                suspended_since = None
                if running_read is not None:
                    running_s += now - running_read
                running_read = now
                if self.max_running_s is not None and running_s >= self.max_running_s:
                    message = (
                        f"still running after {running_s:.0f}s (not counting time suspended), "
                        f"the bound is {self.max_running_s:.0f}s"
                    )
                    yield TriggerEvent(
                        self._event(
                            "Failed",
                            reason=RUNNING_TOO_LONG,
                            message=message,
                            progress=status.progress,
                        )
                    )
                    return
            if self.stop_run_dir is not None:
                if stop_seen is None:
                    request = await asyncio.to_thread(current, self.stop_run_dir)
                    if request is not None:
                        stop_seen = _monotonic()
                        self.log.info("%s: stop requested: %s", where, request.reason)
                if stop_seen is not None and _monotonic() - stop_seen >= self.stop_grace_s:
                    await self.hook.delete_jobset(self.namespace, self.name)
                    message = f"still running {self.stop_grace_s:.0f} s after the stop request"
                    self.log.warning("%s: %s: deleted", where, message)
                    yield TriggerEvent(
                        self._event("Stopped", reason="StopRequest", message=message, progress=line)
                    )
                    return
            await _sleep(self.poll_interval_s)

    def _event(
        self,
        phase: str,
        *,
        reason: str = "",
        message: str = "",
        progress: str = "",
        pods: Sequence[str] = (),
    ) -> dict[str, Any]:
        return {
            "phase": phase,
            "name": self.name,
            "namespace": self.namespace,
            "reason": reason,
            "message": message,
            "progress": progress,
            "pods": list(pods),
        }

    async def _failed_pod_lines(self) -> list[str]:
        # The reason and exit code of the failed pods make the task's error actionable; not
        # being able to read them must not hide the failure itself.
        try:
            return failed_pods(await self.hook.list_jobset_pods(self.namespace, self.name))
        except Exception as exc:
            return [f"(could not read the JobSet's pods: {exc!r})"]

    async def read_jobset(self) -> dict[str, Any]:
        """The JobSet object from the cluster; JobSetGone when it does not exist."""
        return await self.hook.get_jobset(self.namespace, self.name)

    @cached_property
    def hook(self) -> AsyncJobSetHook:
        from tasks.backends.gke.hooks import AsyncJobSetHook

        return AsyncJobSetHook(
            cluster_url=self.cluster_url,
            ssl_ca_cert=self.ssl_ca_cert,
            gcp_conn_id=self.gcp_conn_id,
            impersonation_chain=self.impersonation_chain,
            use_dns_endpoint=self.use_dns_endpoint,
        )
