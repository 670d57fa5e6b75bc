"""Orbax checkpoints: async save, completion tracking, numpy restore, views, fingerprints."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_jobs import checkpoint as ck
from tpu_jobs.model import ModelConfig, init_params, unscan_params

pytestmark = pytest.mark.timeout(300)

CFG = ModelConfig(d_model=32, num_heads=2, num_layers=3, d_ff=64)


def model_params(seed: int = 0) -> dict:
    return init_params(CFG, jax.random.PRNGKey(seed))


def train_state(seed: int = 0) -> dict:
    return {"count": jnp.int32(7), "rng": jax.random.PRNGKey(seed), "mu": jnp.ones((4, 3))}


def save_steps(directory: str, steps: list[int]) -> tuple[ck.CheckpointSaver, dict[int, dict]]:
    saver = ck.CheckpointSaver(directory)
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


# -- fingerprint ----------------------------------------------------------------------------


def test_fingerprint_is_canonical_and_sensitive() -> None:
    params = model_params()
    fp = ck.weights_fingerprint(params)
    assert fp.startswith("sha256:") and len(fp) == len("sha256:") + 64
    # Same weights, other containers / key insertion order / host vs device arrays.
    reordered = {k: params[k] for k in reversed(list(params))}
    as_numpy = jax.tree.map(np.asarray, params)
    assert ck.weights_fingerprint(reordered) == fp
    assert ck.weights_fingerprint(as_numpy) == fp
    # One element changed, a dtype changed, a leaf renamed: all different.
    leaf = np.array(as_numpy["lm_head"]["kernel"])
    leaf[0, 0] = np.nextafter(leaf[0, 0], np.float32(np.inf))
    changed = {**as_numpy, "lm_head": {"kernel": leaf}}
    assert ck.weights_fingerprint(changed) != fp
    cast = {**as_numpy, "lm_head": {"kernel": leaf.astype(np.float64)}}
    assert ck.weights_fingerprint(cast) != ck.weights_fingerprint(changed)
    renamed = {**as_numpy, "lm_head": {"kernel2": as_numpy["lm_head"]["kernel"]}}
    assert ck.weights_fingerprint(renamed) != fp


def test_fingerprint_of_views_equals_fingerprint_of_copies() -> None:
    stacked = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    view = stacked[:, 1]  # non-contiguous
    assert not view.flags["C_CONTIGUOUS"]
    assert ck.weights_fingerprint({"a": view}) == ck.weights_fingerprint({"a": view.copy()})


# -- save, completion, restore --------------------------------------------------------------


def test_async_save_reports_each_step_once_and_only_when_committed(tmp_path) -> None:
    directory = str(tmp_path / "checkpoints")
    saver, saved = save_steps(directory, [])
    reported: list[int] = []
    for step in (4, 5, 6):
        params = jax.tree.map(lambda x, s=step: x * 2 + s, model_params())
        saved[step] = params
        meta = saver.save(step, params, train_state(), timestamp_ms=10 * step, extra={"k": step})
        assert meta.weights_fingerprint == ck.weights_fingerprint(params)
        for done in saver.poll():
            assert ck.is_complete(done.path)  # reported only once committed
            reported.append(done.step)
    for done in saver.wait():
        assert ck.is_complete(done.path)
        reported.append(done.step)
    saver.close()
    assert reported == [4, 5, 6]
    assert saver.poll() == [] and saver.wait() == []
    assert ck.CheckpointSaver(directory).complete_steps() == [4, 5, 6]
    for step, params in saved.items():
        meta = ck.read_meta(os.path.join(directory, str(step)))
        assert meta.step == step and meta.timestamp_ms == 10 * step
        assert meta.extra == {"k": step}
        assert meta.weights_fingerprint == ck.weights_fingerprint(params)


def test_saving_an_existing_step_is_refused(tmp_path) -> None:
    directory = str(tmp_path / "checkpoints")
    saver, _ = save_steps(directory, [3])
    saver.wait()
    saver.close()
    again = ck.CheckpointSaver(directory)
    with pytest.raises(ck.CheckpointError, match="step 3"):
        again.save(3, model_params(), train_state(), timestamp_ms=1)
    again.close()


def test_restore_as_numpy_then_unscanned_views_equal_saved_scanned(tmp_path) -> None:
    directory = str(tmp_path / "checkpoints")
    saver, saved = save_steps(directory, [2])
    [done] = saver.wait()
    saver.close()
    params, meta = ck.restore_params(done.path, expected_fingerprint=done.meta.weights_fingerprint)
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
    with pytest.raises(ck.FingerprintMismatchError, match="manifest expects"):
        ck.restore_params(done[2].path, expected_fingerprint=done[1].meta.weights_fingerprint)


def test_flipped_bit_in_weights_is_caught_by_fingerprint(tmp_path) -> None:
    """Orbax restores the corrupted bytes without complaint; the fingerprint does not."""
    weights = np.arange(1000, dtype=np.float32).reshape(10, 100) + 0.5
    saver = ck.CheckpointSaver(str(tmp_path / "c"))
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
    with pytest.raises(ck.FingerprintMismatchError, match="refusing to use it"):
        ck.restore_params(done.path, expected_fingerprint=done.meta.weights_fingerprint)


def test_half_written_checkpoint_is_not_complete_and_is_cleaned(tmp_path) -> None:
    directory = tmp_path / "checkpoints"
    saver, _ = save_steps(str(directory), [1])
    saver.wait()
    saver.close()
    # What a crash between the data write and the commit leaves on a local disk: the step's
    # data in Orbax's temporary folder, no commit marker at the final name.
    os.rename(directory / "1", directory / "2.orbax-checkpoint-tmp")
    os.remove(directory / "2.orbax-checkpoint-tmp" / ck.COMMIT_MARKER)
    assert not ck.is_complete(str(directory / "2"))
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
        ck.restore_params(str(directory / "2"))
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
        ck.restore_params(str(directory / "2.orbax-checkpoint-tmp"))
    fresh = ck.CheckpointSaver(str(directory))
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
    done = {d.step: d for d in saver.poll() + saver.wait()}
    saver.close()
    assert sorted(done) == [7, 8]
    for step in (7, 8):
        params, meta = ck.restore_params(done[step].path, done[step].meta.weights_fingerprint)
        assert meta.step == step
        assert_tree_equal(params, saved[step])
    # GCS has no rename: a half-written step is a folder without the commit marker.
    bucket, _, name = directory[len("gs://") :].partition("/")
    gcs.client().bucket(bucket).blob(f"{name}/8/{ck.COMMIT_MARKER}").delete()
    assert not ck.is_complete(done[8].path)
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
        ck.restore_params(done[8].path)
    assert ck.CheckpointSaver(directory).complete_steps() == [7]
