"""Property-based (issue 29): a lease file is a holder that reads back as itself, or an
unreadable lease named in one line (which holds nothing: the trainer takes the folder over,
saying so), never a traceback, whatever its bytes."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rcpflow.files.layout import RunLayout
from rcpflow.trainer import ownership

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**63 - 1, -1]),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
)
BASE: dict[str, Any] = {
    "format": ownership.FORMAT, "host": "pod-a", "pid": 4242, "token": "ab" * 8,
    "owner": "dag", "since_ms": 1_700_000_000_000, "heartbeat_ms": 1_700_000_000_000,
}  # fmt: skip


@SETTINGS
@given(
    st.dictionaries(st.sampled_from([*BASE, "by_heartbeat", "extra"]), VALUE, max_size=4),
    st.sets(st.sampled_from(list(BASE)), max_size=2),
)
def test_a_lease_file_reads_back_or_is_one_named_line(changes, removed):
    d = {k: v for k, v in {**BASE, **changes}.items() if k not in removed}
    data = json.dumps(d).encode()
    try:
        holder = ownership.Holder.from_json(data, "owner.json")
    except ValueError as e:
        assert str(e).startswith("owner.json") and "\n" not in str(e), str(e)
        return
    assert ownership.Holder.from_json(holder.to_json(), "again") == holder
    assert 1 <= holder.pid <= ownership.PID_MAX


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | st.dictionaries(st.text(max_size=4), VALUE).map(
    lambda d: json.dumps(d).encode()
))  # fmt: skip
def test_any_lease_bytes_never_crash_the_trainer_nor_the_commands(data):
    with tempfile.TemporaryDirectory() as run_dir:
        path = ownership.lease_path(run_dir)
        with open(path, "wb") as f:
            f.write(data)
        try:
            ownership.check_or_refresh(RunLayout(run_dir), None)  # manifest add, no owner
            ownership.refuse_if_live(RunLayout(run_dir), "a reset")
        except ownership.RunOwnedError as e:
            assert "\n" not in str(e)
        said = ownership.Lease(run_dir, "me", 600).acquire()  # the trainer
        assert said is None or "\n" not in said
        with open(path) as f:
            assert json.load(f)["owner"] == "me"
        assert os.path.isfile(path)
