"""Orbax checkpoints: async saves with rows handed on in step order after their commits,
weights-only steps, completion tracking, numpy restore, views, and the fingerprint check on
restore."""

from __future__ import annotations

import glob
import os
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tpu_jobs.rcp.checkpoint_format import (
    COMMIT_MARKER,
    CheckpointError,
    SavedCheckpoint,
    is_complete,
)
from tpu_jobs.rcp.checkpoint_restore import read_meta, restore_params
from tpu_jobs.rcp.checkpoint_writer import CheckpointSaver
from tpu_jobs.rcp.fingerprint import FingerprintMismatchError, weights_fingerprint
from tpu_jobs.rcp.saver import SaveFailedError, SaveQueueError
from tpu_jobs.toy.model import ModelConfig, init_params, unscan_params

pytestmark = pytest.mark.timeout(300)

CFG = ModelConfig(d_model=32, num_heads=2, num_layers=3, d_ff=64)


def model_params(seed: int = 0) -> dict:
    return init_params(CFG, jax.random.PRNGKey(seed))


def train_state(seed: int = 0) -> dict:
    return {"count": jnp.int32(7), "rng": jax.random.PRNGKey(seed), "mu": jnp.ones((4, 3))}


def save_steps(directory: str, steps: list[int]) -> tuple[CheckpointSaver, dict[int, dict]]:
    saver = CheckpointSaver(directory)
    saved = {}
    for step in steps:
        params = jax.tree.map(lambda x, s=step: x + s, model_params())
        saved[step] = params
        saver.save(step, params, train_state(), timestamp_ms=1000 + step, extra={"seed": 0})
    return saver, saved


def assert_tree_equal(a: dict, b: dict) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# -- save, completion, restore --------------------------------------------------------------


def test_saves_commit_in_step_order_each_reported_once_only_when_committed(tmp_path) -> None:
    directory = str(tmp_path / "checkpoints")
    seen: list[tuple[int, bool, str]] = []

    def on_commit(saved: SavedCheckpoint) -> None:
        seen.append((saved.step, is_complete(saved.path), threading.current_thread().name))

    saver = CheckpointSaver(directory, on_commit=on_commit)
    saved = {}
    for step in (4, 5, 6):
        params = jax.tree.map(lambda x, s=step: x * 2 + s, model_params())
        saved[step] = params
        saver.save(step, params, train_state(), timestamp_ms=10 * step, extra={"k": step})
    done = saver.wait()
    assert [d.step for d in done] == [4, 5, 6]
    assert all(is_complete(d.path) for d in done)
    # Called once per step, in step order, after the commit, off the calling thread.
    assert [(step, complete) for step, complete, _ in seen] == [(4, True), (5, True), (6, True)]
    assert threading.current_thread().name not in {name for _, _, name in seen}
    assert saver.wait() == [] and saver.pending() == []
    saver.close()
    assert CheckpointSaver(directory).complete_steps() == [4, 5, 6]
    for step, params in saved.items():
        meta = read_meta(os.path.join(directory, str(step)))
        assert meta.step == step and meta.timestamp_ms == 10 * step
        assert meta.extra == {"k": step}
        assert meta.weights_fingerprint == weights_fingerprint(params)


class Gate:
    """Holds process 0's hand-on of chosen committed steps until released; records what
    happened when."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold: set[int]) -> None:
        self.hold = hold
        self.open = threading.Event()
        self.events: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        original = CheckpointSaver._watch

        def watch(saver: CheckpointSaver, record: SavedCheckpoint) -> SavedCheckpoint:
            if record.step in self.hold:
                # Released by the test; the timeout only ends a test whose assertion has failed.
                self.open.wait(timeout=60)
            saved = original(saver, record)
            self.note("committed", saved.step)
            return saved

        monkeypatch.setattr(CheckpointSaver, "_watch", watch)

    def note(self, what: str, step: int) -> None:
        with self._lock:
            self.events.append((what, step))


def test_the_caller_never_makes_the_orbax_save_and_returns_before_it(tmp_path, monkeypatch) -> None:
    """The training loop's part of a save is queueing it: Orbax's save call (its copy of the
    arrays to host memory included) runs in the saver's thread."""
    release = threading.Event()
    callers: list[str] = []
    original = ocp.CheckpointManager.save

    def save(manager: ocp.CheckpointManager, step: int, *args, **kwargs) -> bool:
        callers.append(threading.current_thread().name)
        release.wait(timeout=60)  # held until the caller has returned
        return original(manager, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    saver = CheckpointSaver(str(tmp_path / "c"), max_pending=2)
    saver.save(1, model_params(), train_state(), timestamp_ms=1)
    saver.save(2, model_params(), None, timestamp_ms=2)
    assert saver.pending() == [1, 2] and not is_complete(saver.step_path(1))
    release.set()
    assert [d.step for d in saver.wait()] == [1, 2]
    saver.close()
    assert callers and all(name.startswith("checkpoint-saves:") for name in callers), callers
    assert threading.current_thread().name not in callers


def test_a_weights_only_save_holds_no_train_state(tmp_path) -> None:
    saver = CheckpointSaver(str(tmp_path / "c"))
    params = model_params()
    saver.save(1, params, None, timestamp_ms=1)
    saver.save(2, params, train_state(), timestamp_ms=2)
    assert [d.step for d in saver.wait()] == [1, 2]
    assert (saver.has_state(1), saver.has_state(2)) == (False, True)
    with pytest.raises(CheckpointError, match=r"step 1: .* holds no train_state"):
        saver.restore_train_state(1, model_params(1), train_state(1))
    restored, _ = restore_params(saver.step_path(1))  # what the evaluator reads
    assert_tree_equal(restored, params)
    saver.drop_state(2)
    assert not saver.has_state(2) and is_complete(saver.step_path(2))
    saver.close()


def test_backpressure_at_max_pending(tmp_path, monkeypatch) -> None:
    gate = Gate(monkeypatch, hold={1})
    saver = CheckpointSaver(str(tmp_path / "c"), max_pending=2)
    saver.save(1, model_params(), train_state(), timestamp_ms=1)
    saver.save(2, model_params(), train_state(), timestamp_ms=2)  # 2 pending: does not wait
    assert saver.pending() == [1, 2]
    returned = threading.Event()

    def third() -> None:
        saver.save(3, model_params(), train_state(), timestamp_ms=3)
        gate.note("save 3 returned", 3)
        returned.set()

    caller = threading.Thread(target=third)
    caller.start()
    # Would have returned by now without backpressure; the order below is what is asserted.
    returned.wait(timeout=2)
    gate.open.set()
    caller.join(timeout=120)
    assert not caller.is_alive()
    assert gate.events.index(("committed", 1)) < gate.events.index(("save 3 returned", 3))
    assert [d.step for d in saver.wait()] == [1, 2, 3]
    saver.close()


def test_a_failed_commit_is_raised_by_every_later_call_and_stops_the_rows(
    tmp_path, monkeypatch
) -> None:
    release = threading.Event()
    original = CheckpointSaver._watch

    def watch(saver: CheckpointSaver, record: SavedCheckpoint) -> SavedCheckpoint:
        if record.step == 2:
            release.wait(timeout=60)  # fails once step 3 is queued behind it
            raise CheckpointError("step 2: did not commit (simulated)")
        return original(saver, record)

    monkeypatch.setattr(CheckpointSaver, "_watch", watch)
    committed: list[int] = []
    directory = tmp_path / "c"
    saver = CheckpointSaver(
        str(directory), max_pending=3, on_commit=lambda s: committed.append(s.step)
    )
    for step in (1, 2, 3):
        saver.save(step, model_params(), train_state(), timestamp_ms=step)
    release.set()
    with pytest.raises(SaveFailedError, match=r"step 2: .*simulated.*steps \[3\] were queued"):
        saver.wait()
    with pytest.raises(SaveFailedError, match="step 2"):
        saver.save(4, model_params(), train_state(), timestamp_ms=4)
    with pytest.raises(SaveFailedError, match="step 2"):
        saver.close()
    assert committed == [1]  # no row after the failure: a gap after 2 would break the manifest


def test_on_commit_failure_is_raised_and_names_the_committed_step(tmp_path) -> None:
    def on_commit(saved: SavedCheckpoint) -> None:
        raise RuntimeError("manifest unreachable (simulated)")

    saver = CheckpointSaver(str(tmp_path / "c"), on_commit=on_commit)
    saver.save(1, model_params(), train_state(), timestamp_ms=1)
    with pytest.raises(SaveFailedError, match=r"step 1: checkpoint was committed at .* but "):
        saver.wait()
    assert is_complete(str(tmp_path / "c" / "1"))


def test_bad_saves_are_refused_by_name(tmp_path) -> None:
    saver = CheckpointSaver(str(tmp_path / "c"))
    saver.save(5, model_params(), train_state(), timestamp_ms=5)
    with pytest.raises(SaveQueueError, match="step 5: saves must be in increasing step order"):
        saver.save(5, model_params(), train_state(), timestamp_ms=6)
    saver.close()
    with pytest.raises(CheckpointError, match="step 7: save\\(\\) after close"):
        saver.save(7, model_params(), train_state(), timestamp_ms=7)
    with pytest.raises(ValueError, match="max_pending must be at least 1"):
        CheckpointSaver(str(tmp_path / "d"), max_pending=0)


def test_saving_an_existing_step_is_refused(tmp_path) -> None:
    directory = str(tmp_path / "checkpoints")
    saver, _ = save_steps(directory, [3])
    saver.wait()
    saver.close()
    again = CheckpointSaver(directory)
    with pytest.raises(CheckpointError, match="step 3"):
        again.save(3, model_params(), train_state(), timestamp_ms=1)
    again.close()


def test_restore_as_numpy_then_unscanned_views_equal_saved_scanned(tmp_path) -> None:
    directory = str(tmp_path / "checkpoints")
    saver, saved = save_steps(directory, [2])
    [done] = saver.wait()
    saver.close()
    params, meta = restore_params(done.path, expected_fingerprint=done.meta.weights_fingerprint)
    assert meta == done.meta
    for leaf in jax.tree.leaves(params):
        assert type(leaf) is np.ndarray
    assert_tree_equal(params, saved[2])

    outer, layers = unscan_params(params, axis=CFG.param_scan_axis)
    assert len(layers) == CFG.num_layers
    original = jax.tree.map(np.asarray, saved[2])
    for name in outer:
        assert_tree_equal(outer[name], original[name])
    for i, layer in enumerate(layers):
        stacked_leaves = jax.tree.leaves(params["layers"])
        for view, stacked, saved_leaf in zip(
            jax.tree.leaves(layer), stacked_leaves, jax.tree.leaves(original["layers"]), strict=True
        ):
            # A view into the restored stacked buffer, not a copy ...
            assert np.shares_memory(view, stacked)
            assert view.base is not None
            # ... equal to layer i of the saved scanned array (the layer axis is axis 1).
            np.testing.assert_array_equal(view, np.take(saved_leaf, i, axis=CFG.param_scan_axis))


def test_restore_train_state_round_trip(tmp_path) -> None:
    directory = str(tmp_path / "checkpoints")
    saver, saved = save_steps(directory, [5])
    saver.wait()
    params, state, meta = saver.restore_train_state(5, model_params(1), train_state(1))
    saver.close()
    assert meta.step == 5
    assert_tree_equal(params, saved[5])
    assert_tree_equal(state, train_state(0))
    assert isinstance(jax.tree.leaves(state)[0], jax.Array)


# -- what must fail loudly ------------------------------------------------------------------


def test_manifest_fingerprint_mismatch_is_refused(tmp_path) -> None:
    saver, _ = save_steps(str(tmp_path / "c"), [1, 2])
    done = {d.step: d for d in saver.wait()}
    saver.close()
    with pytest.raises(FingerprintMismatchError, match="manifest expects"):
        restore_params(done[2].path, expected_fingerprint=done[1].meta.weights_fingerprint)


def test_flipped_bit_in_weights_is_caught_by_fingerprint(tmp_path) -> None:
    """Orbax restores the corrupted bytes without complaint; the fingerprint does not."""
    weights = np.arange(1000, dtype=np.float32).reshape(10, 100) + 0.5
    saver = CheckpointSaver(str(tmp_path / "c"))
    saver.save(1, {"layers": {"w": jnp.asarray(weights)}}, train_state(), timestamp_ms=1)
    [done] = saver.wait()
    saver.close()
    needle = weights.tobytes()[2000:2032]
    files = [Path(f) for f in glob.glob(f"{done.path}/params/**", recursive=True)]
    hits = [
        (f, f.read_bytes().index(needle)) for f in files if f.is_file() and needle in f.read_bytes()
    ]
    assert len(hits) == 1, hits  # uncompressed: the raw float bytes are in exactly one file
    path, offset = hits[0]
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(FingerprintMismatchError, match="refusing to use it"):
        restore_params(done.path, expected_fingerprint=done.meta.weights_fingerprint)


def test_half_written_checkpoint_is_not_complete_and_is_cleaned(tmp_path) -> None:
    directory = tmp_path / "checkpoints"
    saver, _ = save_steps(str(directory), [1])
    saver.wait()
    saver.close()
    # What a crash between the data write and the commit leaves on a local disk: the step's
    # data in Orbax's temporary folder, no commit marker at the final name.
    os.rename(directory / "1", directory / "2.orbax-checkpoint-tmp")
    os.remove(directory / "2.orbax-checkpoint-tmp" / COMMIT_MARKER)
    assert not is_complete(str(directory / "2"))
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        restore_params(str(directory / "2"))
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        restore_params(str(directory / "2.orbax-checkpoint-tmp"))
    fresh = CheckpointSaver(str(directory))
    assert fresh.complete_steps() == []
    fresh.save(2, model_params(), train_state(), timestamp_ms=5)  # the step can be saved again
    fresh.wait()
    fresh.close()
    assert sorted(os.listdir(directory)) == ["2"]
    assert fresh.complete_steps() == [2]


# -- GCS (fake-gcs-server) ------------------------------------------------------------------


@pytest.mark.gcs
def test_gcs_save_restore_bit_exact_and_half_written_ignored(gcs, gcs_prefix) -> None:
    directory = f"{gcs_prefix}/checkpoints"
    saver, saved = save_steps(directory, [7, 8])
    done = {d.step: d for d in saver.wait()}
    saver.close()
    assert sorted(done) == [7, 8]
    for step in (7, 8):
        params, meta = restore_params(done[step].path, done[step].meta.weights_fingerprint)
        assert meta.step == step
        assert_tree_equal(params, saved[step])
    # GCS has no rename: a half-written step is a folder without the commit marker.
    bucket, _, name = directory[len("gs://") :].partition("/")
    gcs.client().bucket(bucket).blob(f"{name}/8/{COMMIT_MARKER}").delete()
    assert not is_complete(done[8].path)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        restore_params(done[8].path)
    assert CheckpointSaver(directory).complete_steps() == [7]
