"""The reference convergence points, read from the official RCP file mlperf_logging ships."""

import json
from pathlib import Path

import pytest

from rcpflow.records.rcp_reference import RcpFileError, rcp_file, reference_means, reference_point


def test_the_official_file_is_read_not_copied() -> None:
    path = Path(rcp_file())
    assert path.parts[-3:] == ("rcp_checker", "training_6.1.0", "rcps_qwen35_397b_grpo.json")
    records = json.loads(path.read_text())
    want = {
        r["BS"]: sum(r["Epochs to converge"]) / len(r["Epochs to converge"])
        for r in records.values()
    }
    assert reference_means() == dict(sorted(want.items()))


@pytest.mark.parametrize(
    ("gbs", "samples", "step"), [(256, 4608, 18), (512, 5120, 10), (1024, 7168, 7)]
)
def test_listed_batch_sizes(gbs: int, samples: int, step: int) -> None:
    point = reference_point(gbs)
    assert point is not None and not point.interpolated
    assert (point.samples_to_converge, point.step) == (samples, step)


def test_between_listed_sizes_is_interpolated_outside_none() -> None:
    point = reference_point(384)
    assert point is not None and point.interpolated
    assert point.samples_to_converge == pytest.approx((4608 + 5120) / 2)
    assert reference_point(16) is None  # the toy's batch: below every reference
    assert reference_point(2048) is None


def test_a_record_without_epochs_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "rcps.json"
    bad.write_text(json.dumps({"x": {"Benchmark": "qwen35_397b_grpo", "BS": 256}}))
    with pytest.raises(RcpFileError, match="'x' lacks 'Epochs to converge'"):
        reference_point(256, str(bad))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"y": {"Benchmark": "bert", "BS": 256, "Epochs to converge": [1]}}))
    with pytest.raises(RcpFileError, match="'y' is not a qwen35_397b_grpo RCP"):
        reference_means(str(other))
