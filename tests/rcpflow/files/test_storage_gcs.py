"""GCS-only behaviour of rcpflow.files.storage against the real emulator: generation
preconditions."""

from __future__ import annotations

import pytest
from google.api_core.exceptions import PreconditionFailed

from rcpflow.files.storage import GCSStorage, StorageError, split_gcs, storage_for

pytestmark = pytest.mark.gcs


def test_emulator_refuses_a_stale_generation(gcs, gcs_prefix: str) -> None:
    # Without this, the retry tests below would prove nothing.
    bucket, name = split_gcs(gcs_prefix + "/obj")
    blob = gcs.client().bucket(bucket).blob(name)
    blob.upload_from_string(b"v1")
    blob.reload()
    stale = blob.generation
    blob.upload_from_string(b"v2")
    with pytest.raises(PreconditionFailed):
        blob.upload_from_string(b"lost", if_generation_match=stale)
    with pytest.raises(PreconditionFailed):
        blob.upload_from_string(b"lost", if_generation_match=0)  # 0 = "must not exist yet"
    assert blob.download_as_bytes() == b"v2"


def test_update_retries_when_another_writer_wins_the_race(gcs_prefix: str) -> None:
    s = storage_for(gcs_prefix)
    path = gcs_prefix + "/mllog/eval_checkpoints.jsonl"
    s.write_atomic(path, b"a\n")
    seen: list[bytes | None] = []

    def fn(old: bytes | None) -> bytes:
        seen.append(old)
        if len(seen) == 1:
            # Another writer lands between our read and our conditional write.
            s.write_atomic(path, old + b"other\n")
        return old + b"mine\n"

    assert s.update(path, fn) == b"a\nother\nmine\n"
    assert seen == [b"a\n", b"a\nother\n"]  # refused once (412), then retried on fresh data
    assert s.read_bytes(path) == b"a\nother\nmine\n"


def test_update_of_a_new_object_retries_when_someone_creates_it_first(gcs_prefix: str) -> None:
    s = storage_for(gcs_prefix)
    path = gcs_prefix + "/new.jsonl"
    seen: list[bytes | None] = []

    def fn(old: bytes | None) -> bytes:
        seen.append(old)
        if old is None:
            s.write_atomic(path, b"first\n")
        return (old or b"") + b"second\n"

    s.update(path, fn)
    assert seen == [None, b"first\n"]
    assert s.read_bytes(path) == b"first\nsecond\n"


def test_update_gives_up_after_bounded_attempts(gcs_prefix: str) -> None:
    s = GCSStorage(max_attempts=3, backoff_s=0.0)
    path = gcs_prefix + "/contended.txt"
    s.write_atomic(path, b"0")
    calls = 0

    def always_loses(old: bytes | None) -> bytes:
        nonlocal calls
        calls += 1
        s.write_atomic(path, str(calls).encode())  # someone else always writes first
        return b"never written"

    with pytest.raises(StorageError, match=r"contended\.txt"):
        s.update(path, always_loses)
    assert calls == 3
    assert s.read_bytes(path) == b"3"


def test_objects_written_by_another_client_are_visible(gcs, gcs_prefix: str) -> None:
    # Objects written by another client (e.g. Orbax, the Airflow GCS hook) are visible.
    bucket, name = split_gcs(gcs_prefix + "/checkpoints/18/meta")
    gcs.client().bucket(bucket).blob(name).upload_from_string(b"m")
    s = storage_for(gcs_prefix)
    assert s.list(gcs_prefix) == [gcs_prefix + "/checkpoints/18/meta"]
    assert s.read_bytes(gcs_prefix + "/checkpoints/18/meta") == b"m"


def test_split_gcs_rejects_bad_paths() -> None:
    assert split_gcs("gs://b/a/c") == ("b", "a/c")
    with pytest.raises(ValueError, match="not a gs:// path"):
        split_gcs("/local/path")
    with pytest.raises(ValueError, match="without a bucket"):
        split_gcs("gs:///x")
