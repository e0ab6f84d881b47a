"""Spot interruptions on demand, for chaos: AWS Fault Injection Service, the same path AWS documents.

``aws:ec2:send-spot-instance-interruptions`` posts the two-minute notice on the
instance's IMDS (``spot/instance-action``) and interrupts it when the duration
is over. FIS acts through a role it assumes; the run gets its own, allowed to
interrupt only instances tagged with the run, removed with the run. Real FIS
refuses a duration under two minutes (``PT2M``); ``ddctl chaos preempt
--notice 120`` is the shortest that works on EC2.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

from ddctl.providers.aws.clients import Clients
from ddctl.providers.base import RUN_LABEL

ACTION = "aws:ec2:send-spot-instance-interruptions"
TRUST = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "fis.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}


def role_name(run: str) -> str:
    return f"ddctl-{run}-fis"


def policy(run: str) -> dict[str, Any]:
    """Interrupt spot instances of this run only (the condition is on the run's tag)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["ec2:SendSpotInstanceInterruptions", "ec2:DescribeInstances"],
                "Resource": "*",
                "Condition": {"StringEquals": {f"aws:ResourceTag/{RUN_LABEL}": run}},
            }
        ],
    }


def ensure_role(clients: Clients, run: str) -> str:
    iam = clients.client("iam", "us-east-1")
    try:
        return str(iam.get_role(RoleName=role_name(run))["Role"]["Arn"])
    except Exception as exc:
        if getattr(exc, "response", {}).get("Error", {}).get("Code") != "NoSuchEntity":
            raise
    arn = str(
        iam.create_role(
            RoleName=role_name(run), AssumeRolePolicyDocument=json.dumps(TRUST), Tags=[{"Key": RUN_LABEL, "Value": run}]
        )["Role"]["Arn"]
    )
    iam.put_role_policy(RoleName=role_name(run), PolicyName="interrupt-this-run", PolicyDocument=json.dumps(policy(run)))
    return arn


def interrupt(clients: Clients, region: str, run: str, instance_id: str, notice_s: float) -> str:
    """Start an experiment that interrupts ``instance_id`` ``notice_s`` after its notice; returns its id."""
    account = clients.client("sts", region).get_caller_identity()["Account"]
    fis = clients.client("fis", region)
    template = fis.create_experiment_template(
        description=f"ddctl chaos: interrupt {instance_id} of run {run}",
        roleArn=ensure_role(clients, run),
        stopConditions=[{"source": "none"}],
        targets={
            "spot": {
                "resourceType": "aws:ec2:spot-instance",
                "resourceArns": [f"arn:aws:ec2:{region}:{account}:instance/{instance_id}"],
                "selectionMode": "ALL",
            }
        },
        actions={
            "interrupt": {
                "actionId": ACTION,
                "parameters": {"durationBeforeInterruption": f"PT{max(1, math.ceil(notice_s))}S"},
                "targets": {"SpotInstances": "spot"},
            }
        },
        tags={RUN_LABEL: run},
    )["experimentTemplate"]
    return str(fis.start_experiment(experimentTemplateId=template["id"], tags={RUN_LABEL: run})["experiment"]["id"])


def remove(clients: Clients, region: str, run: str) -> list[tuple[str, str]]:
    """The run's experiment templates in ``region`` and (once) its FIS role."""
    removed: list[tuple[str, str]] = []
    fis = clients.client("fis", region)
    with contextlib.suppress(Exception):  # FIS may be unavailable in the region: nothing of ours can be there
        for template in fis.list_experiment_templates().get("experimentTemplates", []):
            if template.get("tags", {}).get(RUN_LABEL) == run:
                fis.delete_experiment_template(id=template["id"])
                removed.append(("fis template", str(template["id"])))
    iam = clients.client("iam", "us-east-1")
    with contextlib.suppress(Exception):
        iam.delete_role_policy(RoleName=role_name(run), PolicyName="interrupt-this-run")
        iam.delete_role(RoleName=role_name(run))
        removed.append(("iam role", role_name(run)))
    return removed
