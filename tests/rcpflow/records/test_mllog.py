"""MLLOG writing through the official API and reading it back."""

import sys
from pathlib import Path

import pytest

from rcpflow import recipe
from rcpflow.records.mllog import (
    MLLogError,
    SystemInfo,
    TrainingLog,
    parse,
    read_events,
    require_mlperf_logging,
    run_start_ms,
)


def _log(tmp_path, division="closed"):
    path = str(tmp_path / "seed_3.out")
    log = TrainingLog(path)
    hp = recipe.hyperparameters(division, 512, max_steps=30)
    log.training_header(hp, seed=3, system=SystemInfo(), train_samples=1000, time_ms=100)
    log.init_stop(200)
    log.run_start(300)
    log.block_start(0, 0, 300)
    log.block_stop(30 * 512, 30, 999)
    return path, hp


def test_round_trip(tmp_path):
    path, hp = _log(tmp_path)
    events = read_events(path)
    by_key = {e.key: e for e in events}
    assert by_key["global_batch_size"].value == 512
    assert by_key["opt_base_learning_rate"].value == hp.learning_rate
    assert by_key["seed"].value == 3
    assert by_key["block_stop"].time_ms == 999
    assert by_key["block_stop"].metadata["samples_count"] == 30 * 512
    assert by_key["init_start"].event_type == "INTERVAL_START"
    assert run_start_ms(events) == 300
    assert not any(e.key == "run_stop" for e in events)
    assert sum(e.key == "train_samples" for e in events) == 1
    # every line is the official encoder's: ':::MLLOG {json}'
    with open(path) as f:
        assert all(line.startswith(":::MLLOG {") for line in f)


def test_header_order_the_closed_checker_needs(tmp_path):
    path, _ = _log(tmp_path)
    order = [e.key for e in read_events(path)]
    for later in ("opt_base_learning_rate", "opt_gradient_clip_norm", "num_generations_per_prompt"):
        assert order.index("global_batch_size") < order.index(later)
    assert order.index("num_prompts_per_step") < order.index("num_generations_per_prompt")
    assert order[:2] == ["cache_clear", "init_start"]
    assert order.index("init_stop") < order.index("run_start")


def test_append_continues_a_log(tmp_path):
    path, _ = _log(tmp_path)
    before = Path(path).read_text()
    TrainingLog(path, append=True).log("event", "train_loss", 0.5, {"step": 31}, time_ms=1000)
    after = Path(path).read_text()
    assert after.startswith(before) and after.count("\n") == before.count("\n") + 1


def test_training_never_writes_eval_section(tmp_path):
    log = TrainingLog(str(tmp_path / "x.out"))
    for key in ("run_stop", "eval_accuracy", "eval_start"):
        with pytest.raises(MLLogError, match="finalize"):
            log.log("event", key, 1.0)


def test_parse_names_the_bad_line():
    good = (
        ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
        '"key": "seed", "value": 1, "metadata": {}}'
    )
    assert parse("noise\n" + good)[0].line_no == 2
    with pytest.raises(MLLogError, match="line 3"):
        parse(good + "\nnoise\n:::MLLOG {broken")


def test_rank_prefix_is_ignored_like_the_checker():
    line = (
        '[0] :::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
        '"key": "seed", "value": 1, "metadata": {}}'
    )
    assert parse(line)[0].key == "seed"


def test_missing_mlperf_logging_fails_at_start(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlperf_logging.mllog", None)
    with pytest.raises(RuntimeError, match="mlperf-logging"):
        require_mlperf_logging()
    with pytest.raises(RuntimeError, match="--no-rcp-logging"):
        TrainingLog(str(tmp_path / "x.out"))
