"""Property-based (issue 29): the deployment TOML's tables are accepted, each value read as
given, or refused in one line naming the file and the key, never a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.backends import registry  # noqa: F401  (registers the [gke] table)
from tasks.deployment import DeploymentError, parse_deployment

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return (
            "nan"
            if math.isnan(v)
            else ("inf" if v == math.inf else ("-inf" if v == -math.inf else repr(v)))
        )
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string is a JSON string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(v)


SCALAR = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, 64, 65, 2**31, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["local", "gke", "after_training", "during_training", "RCPFLOW_X", "HF_TOKEN"]),
    st.lists(st.integers(-3, 300), max_size=3),
)
TOP = ["backend", "eval_window", "eval_schedule", "checkpoint_poll_seconds", "python",
       "train_timeout_minutes", "eval_timeout_minutes", "eval_retries", "unknown_key"]  # fmt: skip
GKE = ["namespace", "poll_interval_s", "run_retries", "fail_exit_codes", "max_suspended_minutes",
       "ttl_after_finished_s", "priority_class", "queue_name"]  # fmt: skip
ENV_NAME = st.one_of(
    st.sampled_from(["JAX_PLATFORMS", "HF_TOKEN", "A\n", "RCPFLOW_RUN_OWNER", "1X", "MY_KEY"]),
    st.text(max_size=6),
)


@SETTINGS
@given(
    st.dictionaries(st.sampled_from(TOP), SCALAR, max_size=4),
    st.dictionaries(ENV_NAME, st.text(max_size=5), max_size=3),
    st.dictionaries(st.sampled_from(GKE), SCALAR, max_size=3),
)
def test_the_deployment_tables_are_read_or_refused_in_one_named_line(top, job_env, gke):
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
    if job_env:
        lines += ["[job_env]", *(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in job_env.items())]
    if gke:
        lines += ["[gke]", *(f"{k} = {toml_value(v)}" for k, v in gke.items())]
    text = "\n".join(lines) + "\n"
    try:
        d = parse_deployment(text, source="d.toml", base_dir=Path("/tmp"))
    except DeploymentError as e:
        message = str(e)
        assert message.startswith("d.toml: ") and "\n" not in message, message
        return
    for key, value in top.items():  # what was accepted is what was given
        if key in ("eval_window", "eval_retries") and not isinstance(value, bool):
            assert getattr(d, key) == value
    assert dict(d.job_env) == job_env
    assert parse_deployment(text, source="d.toml", base_dir=Path("/tmp")) == d
