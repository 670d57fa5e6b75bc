#!/bin/bash
# A stand-in of the reference's launcher script, mlcommons/training
# llm_post_training/docker/mlperf/run_and_time.sh (../shared/reference/nemo-rl.md), with its rules:
# SEED is required; one experiment in deferred mode (NEXP=1); the checkpoints go to
# /checkpoint/${_experiment_index:-01} (the container's mount of the run's checkpoint folder:
# $CHECKPOINT_MOUNT here, set by the srun stand-in); MLPERF_TARGET_ACCURACY defaults to 1.0.
# Training is tests/foreign/nemo_trainer.py (NeMo-RL's files), run with NeMo-RL's seed SEED.
set -euo pipefail
: "${SEED:?run_and_time.sh: SEED is not set}"
if [ "${DEFERRED_OFFLINE_EVAL:-0}" = 1 ] && [ "${NEXP:-1}" != 1 ]; then
  echo "run_and_time.sh: deferred offline evaluation requires NEXP=1" >&2
  exit 1
fi
checkpoint="${CHECKPOINT_MOUNT:-/checkpoint}/${_experiment_index:-01}"
here="$(cd "$(dirname "$0")/.." && pwd)"
exec "${STANDIN_PYTHON:-python3}" "$here/nemo_trainer.py" --checkpoint-dir "$checkpoint" \
  --seed "$SEED" --global-batch-size "$GBS" --max-steps "$MAX_STEPS" \
  --val-start-at "$VAL_START_AT" --division open \
  --target-accuracy "${MLPERF_TARGET_ACCURACY:-1.0}"
