"""Uploads through a link shaped with tc tbf in a network namespace reach the shaped rate."""

from __future__ import annotations

import subprocess

import pytest

from ddctl.bench_link import measure_link
from ddctl.errors import DdctlError
from ddctl.linkshape import available, shaped_link, tbf_args


def test_rates_are_validated_before_anything_is_created() -> None:
    with pytest.raises(DdctlError, match="must be > 0"), shaped_link("ddctl-never", -5):
        pass


def test_the_burst_scales_with_the_rate() -> None:
    assert tbf_args(10)[4] == str(16 * 1024)
    assert int(tbf_args(1000)[4]) == 125_000


@pytest.mark.slow
@pytest.mark.skipif(available() is not None, reason=f"{available()}")
def test_fragment_uploads_reach_90_percent_of_a_shaped_link() -> None:
    result = measure_link(rate_mbit=80.0, uploads=6)
    assert result["goodput_fraction"] >= 0.90, result
    assert 0.8 <= result["tracker_fraction"] <= 1.05, result  # the syncer's tracker sees the same link
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "ddctl-link" not in namespaces  # nothing left behind
