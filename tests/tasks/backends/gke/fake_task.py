"""`FakeTI`: the part of a running task instance the run-job operator, the evaluate operator and
the teardown use (XCom push and pull, task id, map index), for calling an operator's `execute`
without a scheduler."""

from __future__ import annotations

from typing import Any


class FakeTI:
    """Pushes land in `pushed` (key -> value) and are what a pull of this instance's own task
    id and map index reads, as in Airflow; other tasks' XComs are `xcoms`, keyed
    (task_ids, key, map_indexes). Every pull is recorded in `pulls`."""

    def __init__(
        self,
        task_id: str = "g.run",
        map_index: int = -1,
        xcoms: dict[tuple[str, str, int], Any] | None = None,
    ) -> None:
        self.task_id = task_id
        self.map_index = map_index
        self.pushed: dict[str, Any] = {}
        self.xcoms = xcoms or {}
        self.pulls: list[tuple[str, str, int]] = []

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, *, task_ids: str, key: str, map_indexes: int) -> Any:
        self.pulls.append((task_ids, key, map_indexes))
        if (task_ids, map_indexes) == (self.task_id, self.map_index):
            return self.pushed.get(key)
        return self.xcoms.get((task_ids, key, map_indexes))
