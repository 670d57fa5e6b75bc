"""Shard settings (flags over environment), the shard file format, and worker 0's gathering:
stale files ignored, malformed ones refused by line, a fatal shard ends the wait, a timeout
leaves the missing ones missing. Pure Python, no JAX; time is a fake clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tasks.backends.gke.render import render_jobset
from tasks.backends.gke.settings import GkeSettings
from tpu_jobs.eval import shards as es

pytestmark = pytest.mark.timeout(60)

ENV = {es.SLICE_INDEX_ENV: "2", es.NUM_SLICES_ENV: "3", es.ATTEMPT_ID_ENV: "uid-1/0"}


def identity(**overrides: object) -> es.EvalIdentity:
    fields: dict[str, Any] = {
        "attempt_id": "a1",
        "num_shards": 3,
        "checkpoint_path": "/run/checkpoints/3",
        "step": 3,
        "timestamp_ms": 1_000,
        "weights_fingerprint": "sha256:abc",
        "instances": 10,
        "attempts_per_instance": 4,
        "sampling": {"seed": 0, "temperature": 0.1, "top_p": 0.95},
    }
    fields.update(overrides)
    return es.EvalIdentity(**fields)


def records(index: int, ident: es.EvalIdentity) -> tuple[dict, ...]:
    owned = es.Sharding(index, ident.num_shards).instances(ident.instances)
    return tuple(
        {"instance": i, "attempt": a, "status": "resolved" if a == 0 else "failed",
         "reward": 1.0 if a == 0 else 0.0}
        for i in owned for a in range(ident.attempts_per_instance)
    )  # fmt: skip


def shard(index: int, ident: es.EvalIdentity, fatal: str | None = None) -> es.Shard:
    recs = () if fatal else records(index, ident)
    return es.Shard(index=index, path="", fatal_error=fatal, start_ms=5 + index, records=recs)


# --- settings: flags, environment, defaults ------------------------------------------------


def test_defaults_without_flags_or_environment_are_one_shard() -> None:
    assert es.resolve_sharding(None, None, None, {}) == es.Sharding(0, 1, "")


def test_environment_gives_the_defaults_and_explicit_flags_win() -> None:
    assert es.resolve_sharding(None, None, None, ENV) == es.Sharding(2, 3, "uid-1/0")
    assert es.resolve_sharding(1, 4, "mine", ENV) == es.Sharding(1, 4, "mine")
    # Each flag wins on its own; the others still come from the environment.
    assert es.resolve_sharding(0, None, None, ENV) == es.Sharding(0, 3, "uid-1/0")
    assert es.resolve_sharding(None, 5, None, ENV) == es.Sharding(2, 5, "uid-1/0")


@pytest.mark.parametrize(
    ("flags", "env", "needles"),
    [
        ((None, None, None), {es.SLICE_INDEX_ENV: "abc", es.NUM_SLICES_ENV: "3"},
         ["--shard-index", es.SLICE_INDEX_ENV, "'abc'", "not an integer"]),
        ((None, None, None), {es.SLICE_INDEX_ENV: "", es.NUM_SLICES_ENV: "3"},
         ["--shard-index", es.SLICE_INDEX_ENV, "not an integer"]),
        ((None, None, "a"), {es.NUM_SLICES_ENV: "x2"}, ["--num-shards", es.NUM_SLICES_ENV]),
        ((3, 3, "a"), {}, ["--shard-index", "out of range 0..2"]),
        ((-1, 3, "a"), {}, ["--shard-index", "out of range"]),
        ((0, 0, None), {}, ["--num-shards", ">= 1"]),
        ((None, None, None), {es.NUM_SLICES_ENV: "16", es.ATTEMPT_ID_ENV: "u"},
         ["--shard-index", es.SLICE_INDEX_ENV, "16 shards"]),
        ((None, None, None), {es.SLICE_INDEX_ENV: "7", es.NUM_SLICES_ENV: "4"},
         ["--shard-index", f"from {es.SLICE_INDEX_ENV}", "out of range 0..3",
          f"--num-shards (from {es.NUM_SLICES_ENV}"]),
        ((1, 3, None), {}, ["--attempt-id", es.ATTEMPT_ID_ENV]),
        ((1, 3, "  "), {}, ["--attempt-id"]),
    ],
)  # fmt: skip
def test_bad_settings_name_the_flag_and_the_variable(flags, env, needles) -> None:
    with pytest.raises(es.ShardingError) as err:
        es.resolve_sharding(*flags, env)
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.parametrize("count", [1, 3, 16, 300])
def test_shards_partition_the_instances(count: int) -> None:
    parts = [es.Sharding(k, count, "a").instances(251) for k in range(count)]
    flat = [i for part in parts for i in part]
    assert sorted(flat) == list(range(251)) and len(flat) == 251
    assert all(i % count == k for k, part in enumerate(parts) for i in part)


def test_rendered_eval_jobset_gives_every_variable_the_evaluator_reads() -> None:
    jobset = render_jobset(
        GkeSettings(),
        role="evaluate",
        dag_id="d",
        run_id="r",
        job="eval-3",
        command=["python", "-m", "tpu_jobs.evaluate", "--run-dir", "gs://b/run", "--step", "3"],
    )
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    env = pod["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert {es.SLICE_INDEX_ENV, es.NUM_SLICES_ENV, es.ATTEMPT_ID_ENV} <= set(names)
    by_name = {e["name"]: e for e in env}
    assert by_name[es.NUM_SLICES_ENV]["value"] == "16"
    # The attempt id is composed (Kubernetes $(VAR) expansion) from variables defined before it.
    attempt = by_name[es.ATTEMPT_ID_ENV]["value"]
    parts = [p.strip("$()") for p in attempt.split("/")]
    assert all(names.index(p) < names.index(es.ATTEMPT_ID_ENV) for p in parts)
    paths = {by_name[p]["valueFrom"]["fieldRef"]["fieldPath"] for p in parts}
    assert paths == {
        "metadata.labels['jobset.sigs.k8s.io/jobset-uid']",
        "metadata.labels['jobset.sigs.k8s.io/restart-attempt']",
    }


# --- the shard file ------------------------------------------------------------------------


def test_shard_round_trip(tmp_path: Path) -> None:
    ident = identity()
    path = es.write_shard(str(tmp_path), ident, shard(1, ident))
    assert Path(path).name == "shard_1-of-3.jsonl"
    lines = Path(path).read_text().splitlines()
    assert json.loads(lines[0])["kind"] == es.HEADER_KIND and len(lines) == 1 + 3 * 4
    got = es.read_shard(path, ident, 1)
    assert isinstance(got, es.Shard)
    assert got.records == records(1, ident) and got.fatal_error is None and got.start_ms == 6


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("attempt_id", "a0", "attempt_id"),
        ("weights_fingerprint", "sha256:old", "weights_fingerprint"),
        ("timestamp_ms", 999, "timestamp_ms"),
        ("sampling", {"seed": 1, "temperature": 0.1, "top_p": 0.95}, "sampling"),
    ],
)
def test_a_shard_of_another_evaluation_is_stale(tmp_path, field, value, needle) -> None:
    old = identity(**{field: value})
    path = es.write_shard(str(tmp_path), old, shard(2, old, fatal="OSError: transient"))
    got = es.read_shard(path, identity(), 2)
    assert isinstance(got, es.Stale) and needle in got.reason


def test_a_file_that_is_no_shard_is_stale_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "shard_1-of-3.jsonl"
    for text in ("", "garbage\n", '{"kind": "other"}\n'):
        path.write_text(text)
        assert isinstance(es.read_shard(str(path), identity(), 1), es.Stale)


def _rewrite(path: str, edit) -> None:
    lines = Path(path).read_text().splitlines()
    Path(path).write_text("\n".join(edit(lines)) + "\n")


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda ls: [ls[0], *ls[1:3], '{"instance": 0, "attempt": 0', *ls[4:]], "line 4: not JSON"),
        (lambda ls: [ls[0], ls[1].replace('"instance": 1,', '"instance": 2,'), *ls[2:]],
         "line 2: instance 2 attempt 0 does not belong"),
        (lambda ls: [ls[0], ls[1].replace('"resolved"', '"maybe"'), *ls[2:]], "line 2: status"),
        (lambda ls: [ls[0], ls[1].replace('"reward": 1.0', '"reward": "1"'), *ls[2:]],
         "line 2: reward"),
        (lambda ls: ls[:-1], "header says 12 records, the file has 11"),
        (lambda ls: [ls[0], ls[1], *ls[1:-1]], "appears twice"),
    ],
)  # fmt: skip
def test_a_malformed_shard_of_this_evaluation_is_refused_by_line(tmp_path, edit, needle) -> None:
    ident = identity()
    path = es.write_shard(str(tmp_path), ident, shard(1, ident))
    _rewrite(path, edit)
    with pytest.raises(es.ShardError) as err:
        es.read_shard(path, ident, 1)
    assert needle in str(err.value) and path in str(err.value)


def test_a_shard_without_all_its_attempts_is_refused(tmp_path: Path) -> None:
    ident = identity()
    short = es.Shard(index=1, path="", fatal_error=None, start_ms=0, records=records(1, ident)[:-1])
    path = es.write_shard(str(tmp_path), ident, short)
    with pytest.raises(es.ShardError, match=r"1 of 12 attempts missing, e\.g\. .*\(7, 3\)"):
        es.read_shard(path, ident, 1)


# --- gathering -----------------------------------------------------------------------------


class FakeTime:
    """A clock that only moves when the gatherer sleeps; `events` run once their time comes."""

    def __init__(self, events: dict[float, object] | None = None) -> None:
        self.now = 0.0
        self.events = dict(events or {})
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        for at in sorted(t for t in self.events if t <= self.now):
            self.events.pop(at)()


def gather(tmp_path: Path, ident: es.EvalIdentity, fake: FakeTime, timeout_s: float, log=None):
    return es.gather_shards(
        str(tmp_path), ident, shard(0, ident), timeout_s=timeout_s,
        log=log if log is not None else (lambda _: None), clock=fake.clock, sleep=fake.sleep,
    )  # fmt: skip


def test_gather_waits_for_late_shards_and_ignores_a_stale_one_until_replaced(tmp_path) -> None:
    ident, old = identity(), identity(attempt_id="a0")
    es.write_shard(str(tmp_path), old, shard(2, old, fatal="OSError: transient"))  # earlier try
    fake = FakeTime({
        10.0: lambda: es.write_shard(str(tmp_path), ident, shard(1, ident)),
        30.0: lambda: es.write_shard(str(tmp_path), ident, shard(2, ident)),
    })  # fmt: skip
    said: list[str] = []
    got = gather(tmp_path, ident, fake, timeout_s=600, log=said.append)
    assert got.missing == () and got.fatal is None and sorted(got.shards) == [0, 1, 2]
    assert got.shards[2].records == records(2, ident)
    # The stale shard was reported once, not on every poll.
    assert sum("ignoring" in line and "attempt_id 'a0' != 'a1'" in line for line in said) == 1
    merged = es.merge_records(list(got.shards.values()))
    assert [(r["instance"], r["attempt"]) for r in merged] == [
        (i, a) for i in range(10) for a in range(4)
    ]


def test_gather_stops_at_the_timeout_with_the_missing_shards(tmp_path: Path) -> None:
    ident = identity()
    es.write_shard(str(tmp_path), identity(attempt_id="a0"), shard(1, identity(attempt_id="a0")))
    fake = FakeTime()
    got = gather(tmp_path, ident, fake, timeout_s=5)
    assert got.missing == (1, 2) and sorted(got.shards) == [0]
    assert fake.now >= 5 and fake.sleeps <= 100


def test_gather_with_zero_timeout_polls_once(tmp_path: Path) -> None:
    ident = identity()
    es.write_shard(str(tmp_path), ident, shard(1, ident))
    fake = FakeTime()
    got = gather(tmp_path, ident, fake, timeout_s=0)
    assert got.missing == (2,) and fake.sleeps == 0


def test_gather_stops_early_on_a_fatal_shard(tmp_path: Path) -> None:
    ident = identity()
    es.write_shard(str(tmp_path), ident, shard(2, ident, fatal="FingerprintMismatchError: x"))
    fake = FakeTime()
    got = gather(tmp_path, ident, fake, timeout_s=600)
    assert got.fatal is not None and got.fatal.index == 2 and got.missing == (1,)
    assert fake.sleeps == 0


def test_gather_refuses_a_malformed_shard_of_this_evaluation(tmp_path: Path) -> None:
    ident = identity()
    path = es.write_shard(str(tmp_path), ident, shard(1, ident))
    _rewrite(path, lambda ls: ls[:-1])
    with pytest.raises(es.ShardError, match=r"shard_1-of-3\.jsonl"):
        gather(tmp_path, ident, FakeTime(), timeout_s=600)


@pytest.mark.gcs
def test_gather_on_gcs(gcs_prefix: str) -> None:
    attempts_dir = f"{gcs_prefix}/eval/step_3/attempts"
    ident, old = identity(), identity(attempt_id="a0")
    es.write_shard(attempts_dir, old, shard(1, old, fatal="OSError: transient"))
    es.write_shard(attempts_dir, ident, shard(2, ident))
    fake = FakeTime({4.0: lambda: es.write_shard(attempts_dir, ident, shard(1, ident))})
    got = es.gather_shards(
        attempts_dir, ident, shard(0, ident), timeout_s=600,
        log=lambda _: None, clock=fake.clock, sleep=fake.sleep,
    )  # fmt: skip
    assert got.missing == () and got.fatal is None
    assert got.shards[1].path == f"{attempts_dir}/shard_1-of-3.jsonl"
    assert got.shards[1].records == records(1, ident)
