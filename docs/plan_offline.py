"""``ddctl up --plan`` for a regions file against the offline clouds of the tests (moto and the Compute Engine fake).

The README's multi-cloud plan is this script's output: ``.venv/bin/python docs/plan_offline.py
docs/examples/multicloud.yaml``. EC2's spot prices (g6.xlarge $0.3512/h, g5.xlarge $0.3300/h in
us-east-1a) and vCPU quotas (64) are canned answers; GCP's prices are ddctl's dated table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from test_aws_prices import history  # noqa: E402

from aws_cloud import AwsCloud  # noqa: E402 (the tests' fakes, found on the path set above)
from gcp_cloud import GcpCloud  # noqa: E402

NOW = "2026-11-30T12:00:00.000Z"


def main(regions: str) -> int:
    with AwsCloud() as aws, GcpCloud(project="my-project") as gcp, tempfile.TemporaryDirectory() as home:
        spot = [("g6.xlarge", "us-east-1a", 0.3512, NOW), ("g5.xlarge", "us-east-1a", 0.3300, NOW)]
        aws.answer("DescribeSpotPriceHistory", history(spot), region="us-east-1")
        for quota in ("L-3819A6DF", "L-DB2E81BA"):
            aws.answer_quota(quota, 64, region="us-east-1")
        env = {**os.environ, **aws.env(), **gcp.env(), "DDCTL_HOME": home, "DDCTL_SSH_FROM": "100.100.0.1/32", "COLUMNS": "110"}
        env.pop("GOOGLE_CLOUD_PROJECT")  # the file names its project
        return subprocess.run(
            [sys.executable, "-c", "from ddctl.cli.app import main; main()", "up", "--plan", "-f", regions], env=env
        ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "docs" / "examples" / "multicloud.yaml")))
