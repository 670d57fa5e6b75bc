"""What the triggers that watch a cluster job share (`tasks.backends.gke.triggers`,
`tasks.backends.slurm.triggers`): the whole state of a watch is its kwargs, so that every change
ends it with an event carrying them, the operator defers again with them and a triggerer
restart goes on where it was; and a run's stop request, which ends the job `stop_grace_s` after
it was seen."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from airflow.triggers.base import BaseTrigger

from rcpflow.verdict.stop_request import current


class WatchTrigger(BaseTrigger):
    """Base of a watch trigger that is a dataclass (``kw_only=True, eq=False, repr=False``):
    its fields are its kwargs (the constructor's arguments); a field with ``init=False`` is
    the trigger's own (a hook), never part of them."""

    stop_run_dir: str | None
    stop_grace_s: float
    stop_seen: float | None

    def __post_init__(self) -> None:
        super().__init__()

    def kwargs(self) -> dict[str, Any]:
        """What this trigger is made of, its state included (JSON)."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]  # a subclass is a dataclass
        return {f.name: getattr(self, f.name) for f in fields if f.init}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # The subclass's module path; plugins.jobset keeps the path of older releases importable.
        return f"{type(self).__module__}.{type(self).__qualname__}", self.kwargs()

    async def stop_request(self, where: str, now: Callable[[], float]) -> tuple[bool, str | None]:
        """Look for a stop request of `stop_run_dir` (None: none is looked for) until one is
        seen: whether it was seen just now (the state changed), and the reason to end the job
        when it still runs `stop_grace_s` after it (else None). `now` is the trigger's clock."""
        run_dir, seen_now = self.stop_run_dir, False
        if run_dir is None:
            return False, None
        if self.stop_seen is None:
            request = await asyncio.to_thread(current, run_dir)
            if request is not None:
                self.stop_seen, seen_now = now(), True
                self.log.info("%s: stop requested: %s", where, request.reason)
        if self.stop_seen is not None and now() - self.stop_seen >= self.stop_grace_s:
            return seen_now, f"still running {self.stop_grace_s:.0f} s after the stop request"
        return seen_now, None
