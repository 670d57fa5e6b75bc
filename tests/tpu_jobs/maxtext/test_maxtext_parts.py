"""The MaxText job's parts that need no MaxText (Python 3.11, JAX only): the two parameter
layouts and the bf16 rounding between them, the run's MaxText settings, the record a
checkpoint's metadata carries."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rcpflow import recipe
from tpu_jobs.maxtext import config, layout
from tpu_jobs.maxtext.checkpoints import RCPFLOW_KEY, CheckpointRecord, WithRecord
from tpu_jobs.rcp.checkpoint_format import CheckpointError
from tpu_jobs.rcp.fingerprint import weights_fingerprint


def scanned_tree(layers: int = 3) -> dict[str, Any]:
    rng = np.random.default_rng(0)

    def weights(*shape: int) -> np.ndarray:
        return rng.normal(size=shape).astype(np.float32)

    return {
        "decoder": {
            "decoder_norm": {"scale": weights(8)},
            "layers": {
                "mlp": {"wi_0": {"kernel": weights(8, layers, 16)}},
                "norm": {"scale": weights(8, layers)},
                "out": {"kernel": weights(2, layers, 4, 8)},
            },
        },
        "token_embedder": {"embedding": weights(16, 8)},
    }


def test_restack_is_the_inverse_of_slicing_on_the_layer_axis() -> None:
    scanned = scanned_tree()
    unscanned = layout.unstack(scanned)
    assert sorted(unscanned["decoder"]) == ["decoder_norm", "layers_0", "layers_1", "layers_2"]
    assert unscanned["decoder"]["layers_1"]["out"]["kernel"].shape == (2, 4, 8)
    np.testing.assert_array_equal(
        unscanned["decoder"]["layers_2"]["mlp"]["wi_0"]["kernel"],
        scanned["decoder"]["layers"]["mlp"]["wi_0"]["kernel"][:, 2, :],
    )
    again = layout.restack(unscanned)
    assert jax.tree.all(jax.tree.map(np.array_equal, again, scanned))
    assert weights_fingerprint(again) == weights_fingerprint(scanned)


def test_the_fingerprint_crosses_the_layout_change_only_in_the_scanned_layout() -> None:
    """Names and shapes are part of the fingerprint: the unscanned tree's own differs; back in
    the scanned layout it is the scanned one's, and bf16 rounding is the same either side."""
    scanned = scanned_tree()
    rounded_then_unscanned = layout.unstack(layout.as_bf16(scanned))
    assert weights_fingerprint(rounded_then_unscanned) != weights_fingerprint(scanned)
    assert weights_fingerprint(layout.restack(rounded_then_unscanned)) == weights_fingerprint(
        layout.as_bf16(scanned)
    )
    assert weights_fingerprint(layout.as_bf16(scanned)) != weights_fingerprint(scanned)
    leaf = layout.as_bf16(scanned)["token_embedder"]["embedding"]
    assert leaf.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(leaf),
        np.asarray(jnp.asarray(scanned["token_embedder"]["embedding"]), "bfloat16"),
    )


@pytest.mark.parametrize(
    ("names", "why"),
    [(["layers_0", "layers_2"], "are not 0..n-1"), (["decoder_norm"], "no unscanned layers")],
)
def test_restack_refuses_a_tree_it_cannot_put_back(names: list[str], why: str) -> None:
    tree = {"decoder": {n: {"w": np.zeros((2, 2), np.float32)} for n in names}}
    with pytest.raises(KeyError, match=why):
        layout.restack(tree)


def test_the_run_is_maxtexts_adamw_at_the_recipes_constant_rate_on_scanned_layers() -> None:
    hp = recipe.hyperparameters("closed", 256, 40)
    settings = config.train_overrides(config.ModelConfig(), hp, 7, "gs://bucket/runs/seed_7")
    assert (settings["base_output_directory"], settings["run_name"]) == (
        "gs://bucket/runs",
        "seed_7",
    )
    assert settings["opt_type"] == "adamw" and settings["learning_rate"] == hp.learning_rate
    assert (settings["adam_b1"], settings["adam_b2"], settings["adam_eps"]) == (0.9, 0.999, 1e-8)
    assert settings["adam_weight_decay"] == 0 and settings["init_weights_seed"] == 7
    assert settings["gradient_clipping_threshold"] == hp.gradient_clip_norm
    # WSD with neither warmup nor decay: the stable phase, a constant rate, on every step.
    assert settings["lr_schedule_type"] == "wsd" and settings["warmup_steps_fraction"] == 0
    assert settings["wsd_decay_steps_fraction"] == 0
    assert settings["learning_rate_schedule_steps"] == settings["steps"] == 41
    assert settings["scan_layers"] is True and settings["param_scan_axis"] == 1
    assert settings["per_device_batch_size"] == 256 and settings["vocab_size"] == 16
    restore = config.restore_overrides(config.ModelConfig(num_layers=3), "/x/0/items")
    assert restore["scan_layers"] is False and restore["base_num_decoder_layers"] == 3


def test_a_model_config_round_trips_and_refuses_nonsense() -> None:
    size = config.ModelConfig(num_layers=4)
    assert config.ModelConfig.from_json(size.to_json(), where="x") == size
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        config.ModelConfig(num_heads=0)
    with pytest.raises(ValueError, match="malformed"):
        config.ModelConfig.from_json({"emb_dim": 8}, where="x")


class Checkpointer:
    use_async = True

    def __init__(self) -> None:
        self.saved: list[tuple[int, dict[str, Any]]] = []

    def save_checkpointables_async(
        self, step: int, items: Any, *, force: bool = False, custom_metadata: Any = None
    ) -> bool:
        self.saved.append((step, custom_metadata))
        return True


def test_the_record_goes_into_the_steps_metadata_beside_maxtexts_own() -> None:
    record = CheckpointRecord(
        step=5, timestamp_ms=123, weights_fingerprint="pos32:a",
        weights_fingerprint_bf16="pos32:b", run={"seed": 1}, model=config.ModelConfig().to_json(),
    )  # fmt: skip
    assert CheckpointRecord.from_json(record.to_json(), where="x") == record
    inner = Checkpointer()
    wrapped = WithRecord(inner, record)
    assert wrapped.use_async  # everything else is MaxText's checkpointer's
    wrapped.save_checkpointables_async(5, {}, force=False, custom_metadata={"scan_layers": True})
    assert inner.saved == [(5, {"scan_layers": True, RCPFLOW_KEY: record.to_json()})]
    with pytest.raises(CheckpointError, match="step 6: MaxText saved it with step 5's record"):
        wrapped.save_checkpointables_async(6, {}, custom_metadata={})
    with pytest.raises(CheckpointError, match="malformed"):
        CheckpointRecord.from_json({**record.to_json(), "timestamp_ms": "x"}, where="x")
