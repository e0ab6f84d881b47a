"""Real AWS, behind a marker: only with credentials and ``DDCTL_AWS_SMOKE=1`` (it calls EC2's real API).

``-m cloud`` selects these; without them they skip saying so. The plan is
read-only (spot price history, instance types, quotas): nothing is made and
nothing is spent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddctl.cli.app import app

EXAMPLE = Path(__file__).parent.parent / "docs" / "examples" / "aws.yaml"


def _why_not() -> str | None:
    if os.environ.get("DDCTL_AWS_SMOKE") != "1":
        return "real-cloud smoke test: set DDCTL_AWS_SMOKE=1 (and AWS credentials) to run it against AWS"
    import boto3

    if boto3.session.Session().get_credentials() is None:
        return "real-cloud smoke test: no AWS credentials (AWS_PROFILE, keys or SSO)"
    return None


pytestmark = [pytest.mark.cloud, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def test_the_plan_prices_real_regions_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["up", "-f", str(EXAMPLE), "--plan", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    for region in plan["regions"]:
        assert region["spot_per_hour"] is not None and 0 < region["spot_per_hour"] < region["on_demand_per_hour"]
        assert region["zone"].startswith(region["cloud_region"])
