"""The ordered save queue with a plain Python writer (no Orbax, no JAX): step order, one worker
thread, backpressure at max_pending, failures raised by the next call, wait() draining."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from tpu_jobs.rcp.saver import OrderedSaveQueue, SaveFailedError, SaveQueueError

pytestmark = pytest.mark.timeout(60)

# Only a test whose assertion already failed waits this long for an event.
GIVE_UP_S = 30.0


@dataclass(frozen=True)
class Done:
    step: int
    path: str


class Writer:
    """Writes into a dict; holds the writes of chosen steps until released, fails chosen steps,
    and records every event in the order it happened."""

    def __init__(self, hold: frozenset[int] = frozenset(), fail: frozenset[int] = frozenset()):
        self.hold, self.fail = hold, fail
        self.release = threading.Event()
        self.started = threading.Event()  # the first write has begun
        self.stored: dict[int, str] = {}
        self.events: list[tuple[str, int]] = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def note(self, what: str, step: int) -> None:
        with self._lock:
            self.events.append((what, step))

    def write(self, job: tuple[int, str]) -> Done:
        step, payload = job
        self.threads.add(threading.current_thread().name)
        self.note("write", step)
        self.started.set()
        if step in self.hold:
            assert self.release.wait(GIVE_UP_S)
        if step in self.fail:
            raise OSError(f"disk full at {step} (simulated)")
        self.stored[step] = payload
        self.note("committed", step)
        return Done(step=step, path=f"/store/{step}")


def queue_for(writer: Writer, max_pending: int = 2, **kw) -> OrderedSaveQueue:
    return OrderedSaveQueue(writer.write, max_pending=max_pending, thread_name="saves", **kw)


def test_steps_are_written_in_order_on_one_thread_then_committed() -> None:
    writer = Writer()
    commits: list[tuple[int, str]] = []
    queue = queue_for(
        writer, max_pending=3, on_commit=lambda d: commits.append((d.step, writer.stored[d.step]))
    )
    for step in (2, 5, 9):
        queue.put(step, lambda s=step: (s, f"payload {s}"))
    done = queue.wait()
    assert [d.step for d in done] == [2, 5, 9]
    assert writer.events == [(w, s) for s in (2, 5, 9) for w in ("write", "committed")]
    # on_commit saw each step after its write, in order, in the worker thread.
    assert commits == [(2, "payload 2"), (5, "payload 5"), (9, "payload 9")]
    assert writer.threads == {"saves"}
    assert queue.wait() == [] and queue.pending() == []
    queue.close()


def test_steps_must_increase_and_close_refuses_more() -> None:
    queue = queue_for(Writer())
    queue.put(3, lambda: (3, "x"))
    with pytest.raises(SaveQueueError, match=r"step 3: saves must be in increasing step order"):
        queue.put(3, lambda: (3, "y"))
    with pytest.raises(SaveQueueError, match=r"step 2: .*\(last was 3\)"):
        queue.check(2)
    queue.close()
    queue.close()  # idempotent
    with pytest.raises(SaveQueueError, match=r"step 4: save\(\) after close\(\)"):
        queue.put(4, lambda: (4, "z"))
    with pytest.raises(ValueError, match="max_pending must be at least 1"):
        queue_for(Writer(), max_pending=0)


def test_prepare_runs_in_the_caller_and_its_error_queues_nothing() -> None:
    writer = Writer()
    queue = queue_for(writer)
    callers: list[str] = []

    def prepare() -> tuple[int, str]:
        callers.append(threading.current_thread().name)
        raise ValueError("cannot snapshot")

    with pytest.raises(ValueError, match="cannot snapshot"):
        queue.put(1, prepare)
    assert callers == [threading.current_thread().name]
    assert queue.pending() == [] and queue.wait() == []
    queue.put(1, lambda: (1, "again"))  # the refused step was not taken as the last one
    assert [d.step for d in queue.wait()] == [1]


def test_put_blocks_at_max_pending_until_the_head_commits() -> None:
    writer = Writer(hold=frozenset({1}))
    queue = queue_for(writer, max_pending=2)
    queue.put(1, lambda: (1, "a"))
    queue.put(2, lambda: (2, "b"))  # two pending: returns without waiting
    assert writer.started.wait(GIVE_UP_S)
    assert queue.pending() == [1, 2]
    prepared = threading.Event()

    def third() -> None:
        def prepare() -> tuple[int, str]:
            writer.note("prepare", 3)
            prepared.set()
            return (3, "c")

        queue.put(3, prepare)
        writer.note("put returned", 3)

    caller = threading.Thread(target=third)
    caller.start()
    # Backpressure: while step 1 is held, the third put prepares nothing and does not return.
    assert not prepared.wait(0.5)
    assert caller.is_alive() and queue.pending() == [1, 2]
    writer.release.set()
    caller.join(GIVE_UP_S)
    assert not caller.is_alive()
    assert writer.events.index(("committed", 1)) < writer.events.index(("prepare", 3))
    assert [d.step for d in queue.wait()] == [1, 2, 3]
    assert writer.stored == {1: "a", 2: "b", 3: "c"}


def test_wait_drains_every_queued_save_and_returns_each_once() -> None:
    writer = Writer(hold=frozenset({1}))
    queue = queue_for(writer, max_pending=3)
    for step in (1, 2, 3):
        queue.put(step, lambda s=step: (s, str(s)))
    returned: list[list[int]] = []
    waiter = threading.Thread(target=lambda: returned.append([d.step for d in queue.wait()]))
    waiter.start()
    assert writer.started.wait(GIVE_UP_S)
    assert returned == [] and queue.pending() == [1, 2, 3]
    writer.release.set()
    waiter.join(GIVE_UP_S)
    assert returned == [[1, 2, 3]]
    assert sorted(writer.stored) == [1, 2, 3] and queue.pending() == []
    queue.put(4, lambda: (4, "4"))
    assert [d.step for d in queue.wait()] == [4]


def test_a_failed_write_stops_the_queue_and_every_later_call_raises_it() -> None:
    writer = Writer(hold=frozenset({2}), fail=frozenset({2}))
    committed: list[int] = []
    queue = queue_for(writer, max_pending=3, on_commit=lambda d: committed.append(d.step))
    for step in (1, 2, 3):
        queue.put(step, lambda s=step: (s, str(s)))
    writer.release.set()  # step 2 fails only once step 3 is queued behind it
    with pytest.raises(SaveFailedError, match=r"^step 2: checkpoint could not be saved: ") as e:
        queue.wait()
    assert "disk full at 2" in str(e.value) and "steps [3] were queued after it" in str(e.value)
    assert isinstance(e.value.__cause__, OSError)
    with pytest.raises(SaveFailedError, match="step 2"):
        queue.put(4, lambda: (4, "4"))
    with pytest.raises(SaveFailedError, match="step 2"):
        queue.check(5)
    with pytest.raises(SaveFailedError, match="step 2"):
        queue.close()
    assert committed == [1] and sorted(writer.stored) == [1]  # no gap after 2: 3 never written
    assert queue.pending() == []


def test_a_failed_on_commit_names_where_the_step_was_committed() -> None:
    writer = Writer()

    def on_commit(done: Done) -> None:
        raise RuntimeError("manifest unreachable (simulated)")

    queue = queue_for(writer, on_commit=on_commit)
    queue.put(7, lambda: (7, "x"))
    with pytest.raises(
        SaveFailedError, match=r"^step 7: checkpoint was committed at /store/7 but on_commit failed"
    ):
        queue.wait()
    assert writer.stored == {7: "x"}
