"""The learner's progress lines (agent/progress.py): when they are due, what they say, and a real learner's log."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest

from ddctl_agents.agent.progress import Progress, ProgressSample
from ddctl_agents.entrypoint import LOG_TIME_FORMAT
from tests.service_harness import Job, small_job

STAMPED = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z (\S+) (INFO|WARNING|ERROR) (.*)$")
SAMPLE = ProgressSample(
    step=1,
    loss=None,
    tokens_per_s=12_345.0,
    sent_tokens=0,
    acked_tokens=0,
    rejected_tokens=0,
    bytes_up=0,
    bytes_down=0,
    versions=(0, 0, 0),
    silent_s=0.0,
)


def texts(lines: list) -> list[tuple[int, str]]:
    return [(line.level, line.text) for line in lines]


def test_a_line_at_the_first_step_then_one_every_interval() -> None:
    progress = Progress(total=200, every_s=10.0)
    [(level, first)] = texts(progress.observe(100.0, SAMPLE))
    assert level == logging.INFO
    assert first == "step 1/200 (0.5%) loss - tokens/s 12.3k sent 0 acked 0 tokens adopted 0 up 0B down 0B"
    assert progress.observe(105.0, replace(SAMPLE, step=2)) == []
    assert progress.observe(109.9, replace(SAMPLE, step=3)) == []
    later = replace(SAMPLE, step=50, loss=2.5, sent_tokens=1_200_000, acked_tokens=1_100_000, bytes_up=3_400_000)
    [(_, line)] = texts(progress.observe(110.0, later))
    assert line.startswith("step 50/200 (25.0%) loss 2.5000 tokens/s 12.3k sent 1.2M acked 1.1M tokens")
    assert line.endswith("up 3.4MB down 0B")
    assert progress.observe(115.0, later) == []


def test_adoptions_count_every_fragment_version_that_moves_forward() -> None:
    progress = Progress(total=100, every_s=1000.0)
    progress.observe(0.0, SAMPLE)  # the bootstrap's versions are the baseline
    progress.observe(1.0, replace(SAMPLE, versions=(1, 0, 0)))
    progress.observe(2.0, replace(SAMPLE, versions=(1, 3, 1)))  # a missed version still counts as one adoption
    progress.observe(3.0, replace(SAMPLE, versions=(1, 3, 1)))
    assert progress.adopted == 3
    assert "adopted 3 " in progress.describe(SAMPLE)


def test_refusals_warn_once_per_new_refusal() -> None:
    progress = Progress(total=100, every_s=1000.0)
    progress.observe(0.0, SAMPLE)
    [(level, text)] = texts(progress.observe(1.0, replace(SAMPLE, rejected_tokens=4096)))
    assert level == logging.WARNING and text.startswith("the syncer refused 4.1k fragment-tokens of updates (4.1k so far)")
    assert progress.observe(2.0, replace(SAMPLE, rejected_tokens=4096)) == []
    [(level, text)] = texts(progress.observe(3.0, replace(SAMPLE, rejected_tokens=5096)))
    assert level == logging.WARNING and "refused 1k fragment-tokens" in text and "(5.1k so far)" in text


def test_a_silent_syncer_warns_once_and_its_return_is_said() -> None:
    progress = Progress(total=100, every_s=1000.0, silent_warn_s=15.0)
    progress.observe(0.0, SAMPLE)
    assert progress.observe(1.0, replace(SAMPLE, silent_s=14.0)) == []
    [(level, text)] = texts(progress.observe(2.0, replace(SAMPLE, silent_s=16.0)))
    assert level == logging.WARNING and text == "no answer from the syncer for 16 s; retrying (training goes on)"
    assert progress.observe(3.0, replace(SAMPLE, silent_s=40.0)) == []
    assert texts(progress.observe(4.0, replace(SAMPLE, silent_s=0.2))) == [(logging.INFO, "the syncer answers again")]


def test_no_total_no_percentage() -> None:
    assert Progress(total=0).describe(SAMPLE).startswith("step 1/0 loss")


def test_log_lines_are_stamped_in_utc_iso_8601() -> None:
    assert LOG_TIME_FORMAT == "%Y-%m-%dT%H:%M:%S"


@pytest.mark.slow
def test_a_real_learner_logs_progress_while_it_trains_and_the_syncer_logs_joins(tmp_path: Path) -> None:
    job = Job.create(tmp_path, small_job(learners=1, tokens=40_000, fragments=2))
    try:
        job.start_syncer()
        job.start_learner("L0")
        job.wait_learners(timeout_s=240)
    finally:
        job.stop_all()
        job.local.stop()
    stamped = [m.groups() for m in map(STAMPED.match, job.log("L0").splitlines()) if m]
    progress = [text for name, level, text in stamped if name == "ddctl_agents.agent.progress" and level == "INFO"]
    assert progress, job.log("L0")
    assert re.fullmatch(
        r"step 1/\d+ \([\d.]+%\) loss - tokens/s \S+ sent \S+ acked \S+ tokens adopted \d+ up \S+ down \S+", progress[0]
    )
    last = progress[-1]
    assert last.startswith("stopped (finished): step ") and " adopted " in last, progress
    assert not [line for line in job.log("L0").splitlines() if "HTTP Request" in line]  # httpx's own INFO stays quiet
    syncer = [m.groups() for m in map(STAMPED.match, job.local.log_path.read_text().splitlines()) if m]
    said = [text for name, level, text in syncer if name == "ddctl_agents.service.roster" and level == "INFO"]
    assert any(text.startswith("join learner=L0 ") for text in said), said
    assert any(text.startswith("leave learner=L0 ") for text in said), said
