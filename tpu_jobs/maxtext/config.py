"""What a MaxText run of the digit task is made of, as MaxText's own ``key=value`` settings.

MaxText reads its configuration from ``base.yml`` (shipped in the ``maxtext`` package) plus
overrides. `ModelConfig` is the model's size (recorded in every checkpoint, so the evaluator
builds the same model); `train_overrides` adds the run: the recipe's optimizer as MaxText's
``adamw`` with a constant schedule (``wsd`` without warmup or decay), the batch, the checkpoint
folder and MaxText's own scanned layout (``scan_layers``, ``param_scan_axis`` 1);
`convert_overrides` and `restore_overrides` are those of MaxText's scanned -> unscanned
converter and of ``from_pretrained(scan_layers=false)``. Nothing here imports MaxText.
"""

from __future__ import annotations

import importlib.util
import posixpath
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rcpflow import recipe
from tpu_jobs import task

# Prompt (6 tokens) + answer (1), padded to a multiple of 8 (MaxText's sequence axis).
SEQUENCE_LENGTH = 8
ANSWER_POSITION = task.PROMPT_LENGTH  # where the answer token sits in a sequence
PARAM_SCAN_AXIS = 1  # MaxText's default: a stacked layer leaf holds the layer index on axis 1
RUN_NAME_OF_UNSCANNED = "unscanned"


@dataclass(frozen=True)
class ModelConfig:
    """A small MaxText decoder (``decoder_block: llama2``, MaxText's default) over the task's
    16-token vocabulary; float32 weights and activations (CPU)."""

    emb_dim: int = 64
    num_heads: int = 2
    head_dim: int = 32
    mlp_dim: int = 128
    num_layers: int = 2

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: object, where: str) -> ModelConfig:
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: no MaxText model config: {d!r}")
        try:
            return cls(**{k: d[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: malformed MaxText model config {dict(d)!r} ({e!r})") from e

    def overrides(self) -> dict[str, Any]:
        return {
            "base_emb_dim": self.emb_dim,
            "base_num_query_heads": self.num_heads,
            "base_num_kv_heads": self.num_heads,
            "head_dim": self.head_dim,
            "base_mlp_dim": self.mlp_dim,
            "base_num_decoder_layers": self.num_layers,
            "vocab_size": task.VOCAB_SIZE,
            "max_target_length": SEQUENCE_LENGTH,
            "attention": "dot_product",
            "dtype": "float32",
            "weight_dtype": "float32",
            "enable_dropout": False,
            "packing": False,
        }


# MaxText's services this job does not use on these machines (each would need a cloud account
# or a missing package) and its single-process CPU setup.
_QUIET = {
    "hardware": "cpu",
    "skip_jax_distributed_system": True,
    "dataset_type": "synthetic",  # built but unused: the batches come from `tpu_jobs.task`
    "enable_tensorboard": False,
    "enable_goodput_recording": False,
    "monitor_goodput": False,
}


def base_yml() -> str:
    """MaxText's ``configs/base.yml``, found without importing MaxText."""
    spec = importlib.util.find_spec("maxtext")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "maxtext is not installed here: run in MaxText's environment (docs/maxtext.md)"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "configs" / "base.yml")


def argv(overrides: Mapping[str, Any]) -> list[str]:
    """MaxText's command line: program name, ``base.yml``, then ``key=value`` each."""

    def text(value: Any) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    return ["maxtext", base_yml(), *(f"{k}={text(v)}" for k, v in overrides.items())]


def output_of(folder: str) -> dict[str, str]:
    """MaxText writes below ``base_output_directory/run_name``: this puts its ``checkpoints/``
    folder at ``folder/checkpoints`` (the run folder's, rcpflow.files.layout)."""
    folder = folder.rstrip("/")
    parent, name = posixpath.split(folder)
    return {"base_output_directory": parent or ".", "run_name": name}


def train_overrides(
    model: ModelConfig, hp: recipe.Hyperparameters, seed: int, run_dir: str
) -> dict[str, Any]:
    """Every setting of a training run: `model`, the recipe's optimizer, the batch (one device:
    the whole global batch), checkpoints of MaxText's scanned layout in the run folder."""
    if hp.lr_schedule != "constant" or hp.warmup_steps != 0:
        raise ValueError(
            f"only a constant schedule without warmup is implemented; hyperparameters say "
            f"lr_schedule={hp.lr_schedule!r}, warmup_steps={hp.warmup_steps}"
        )
    return {
        **model.overrides(),
        **_QUIET,
        **output_of(run_dir),
        # MaxText counts its checkpoint k as k + 1 steps done (its loop's steps start at 0); this
        # job's checkpoint k holds k updates, so MaxText's bound is one above max_steps.
        "steps": hp.max_steps + 1,
        "per_device_batch_size": hp.global_batch_size,
        "init_weights_seed": seed,
        "opt_type": "adamw",
        "learning_rate": hp.learning_rate,
        "adam_b1": hp.adam_beta_1,
        "adam_b2": hp.adam_beta_2,
        "adam_eps": hp.adam_epsilon,
        "adam_eps_root": 0.0,
        "adam_weight_decay": hp.weight_decay,
        "gradient_clipping_threshold": hp.gradient_clip_norm,
        # A constant rate: WSD's stable phase over every step, no warmup, no decay.
        "lr_schedule_type": "wsd",
        "warmup_steps_fraction": 0.0,
        "wsd_decay_steps_fraction": 0.0,
        "learning_rate_schedule_steps": hp.max_steps + 1,
        "scan_layers": True,
        "param_scan_axis": PARAM_SCAN_AXIS,
        "enable_checkpointing": True,
        "checkpoint_period": 1,  # the job asks for a save from val_start_at on only
        "async_checkpointing": True,
        "save_checkpoint_on_completion": False,
        "max_num_checkpoints_to_keep": None,
    }


def convert_overrides(model: ModelConfig, scanned_items: str, out_dir: str) -> dict[str, Any]:
    """MaxText's ``generate_param_only_checkpoint`` of one scanned training checkpoint's
    ``items`` into ``out_dir/checkpoints/0/items`` (unscanned, bf16, parameters only)."""
    return {
        **model.overrides(),
        **_QUIET,
        **output_of(out_dir),
        "per_device_batch_size": 1,
        "load_full_state_path": scanned_items,
        "scan_layers": True,
        "force_unroll": True,
        "param_scan_axis": PARAM_SCAN_AXIS,
        "async_checkpointing": False,
    }


def restore_overrides(model: ModelConfig, unscanned_items: str) -> dict[str, Any]:
    """``from_pretrained`` of a converted checkpoint: the same model, layers unscanned."""
    return {
        **model.overrides(),
        **_QUIET,
        "run_name": RUN_NAME_OF_UNSCANNED,
        "per_device_batch_size": 1,
        "load_parameters_path": unscanned_items,
        "scan_layers": False,
        "enable_checkpointing": False,
    }
