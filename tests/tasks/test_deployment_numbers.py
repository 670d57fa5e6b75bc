"""Every number of the deployment file is bounded (issue 29): the settings reader keeps ints
within int32 and floats within 1e9 for every table, and the deployment's own numbers have their
documented ranges; each refusal is one line naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.backends import registry  # noqa: F401  (registers the [gke] table)
from tasks.deployment import MAX_EVAL_WINDOW, DeploymentError, parse_deployment


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("eval_window = 65", "eval_window"),
        ("eval_window = 9223372036854775807", "eval_window"),
        ("train_timeout_minutes = 99999999999", "train_timeout_minutes"),
        ("eval_timeout_minutes = 1000000", "eval_timeout_minutes"),
        ("eval_retries = 1000", "eval_retries"),
        ("checkpoint_poll_seconds = 1e308", "checkpoint_poll_seconds"),
        ("checkpoint_poll_seconds = 86400", "checkpoint_poll_seconds"),
        ('backend = "gke"\n[gke]\npoll_interval_s = 1e300', "gke.poll_interval_s"),
        ('backend = "gke"\n[gke]\nrun_retries = 4294967296', "gke.run_retries"),
        ('backend = "gke"\n[gke]\nfail_exit_codes = [2, 9223372036854775807]', "fail_exit_codes"),
    ],
)
def test_a_number_beyond_its_range_is_one_line_naming_the_key(tmp_path: Path, toml, key):
    with pytest.raises(DeploymentError) as refused:
        parse_deployment(toml + "\n", source="d.toml", base_dir=tmp_path)
    message = str(refused.value)
    assert message.startswith("d.toml: ") and key in message and "\n" not in message


def test_the_eval_window_bounds_agree():
    d = parse_deployment(f"eval_window = {MAX_EVAL_WINDOW}\n", source="d", base_dir=Path("."))
    assert d.eval_window == MAX_EVAL_WINDOW
