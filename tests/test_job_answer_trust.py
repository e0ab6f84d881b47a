"""What a learner reads from a synchronizer at its start is checked before it is used: the job, the model files
that come with it and the step it resumes at. Each case below ended the learner with a traceback (a KeyError,
TypeError, OverflowError, libgomp's abort) or killed its upload threads at their first encode (found by an audit
of what a learner takes from a shard)."""

from __future__ import annotations

from typing import Any

import pytest

from ddctl_agents.agent.comm import Comms, Identity
from ddctl_agents.agent.routes import Routes
from ddctl_agents.agent.run import _assemble
from ddctl_agents.errors import ConfigError
from ddctl_agents.train.config import SyncSettings
from ddctl_agents.train.job import MOST_THREADS, JobConfig
from ddctl_agents.train.modelfiles import MAX_SOURCE_BYTES, unpack


@pytest.mark.parametrize("block", [7, 0, 4104, True])
def test_a_block_the_codecs_cannot_take_is_refused_with_the_job(block: object) -> None:
    with pytest.raises(ConfigError, match=r"block must be a multiple of 8 in \[8, 4096\], got"):
        SyncSettings(block=block)  # type: ignore[arg-type]
    assert SyncSettings(block=64).block == 64


def test_threads_past_any_machines_cores_are_refused() -> None:
    with pytest.raises(ConfigError, match=rf"threads must be in \[1, {MOST_THREADS}\], got 1000000"):
        JobConfig(threads=10**6)
    assert JobConfig(threads=MOST_THREADS).threads == MOST_THREADS


@pytest.mark.parametrize("job", [None, [], "tiny", 7])
def test_a_job_answer_without_a_job_object_is_a_config_error(job: object) -> None:
    with pytest.raises(ConfigError, match="JobConfig: the value"):
        _assemble(job, {})


@pytest.mark.parametrize(
    ("files", "says"),
    [
        (["model.py"], "must map names to source texts, got list"),
        ({"model.py": 7}, "must map names to source texts, got dict"),
        ({"model\0.py": "x = 1"}, "a name that is not printable or a NUL byte"),
        ({"model.py": "x = 1\0"}, "a name that is not printable or a NUL byte"),
        ({"model.py": "#" * (MAX_SOURCE_BYTES + 1)}, f"at most {MAX_SOURCE_BYTES} travel with a job"),
    ],
)
def test_model_files_of_another_shape_or_size_are_refused(files: Any, says: str, tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=says):
        unpack(files, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written
    assert unpack({"model.py": "x = 1\n"}, tmp_path) is not None


@pytest.mark.parametrize("step", [None, {}, "4", pytest.param(10**5000, id="5000-digits"), -3, 1 << 62, float("inf"), True])
def test_a_start_step_that_is_none_ends_the_start_with_a_config_error(step: object) -> None:
    comms = Comms(
        lambda url: None, Routes({"": "http://127.0.0.1:9"}), Identity(name="L0", incarnation=1, region="r"), "int4", 128
    )  # type: ignore[arg-type,return-value]
    comms._register = lambda url: {"start_step": step}  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="the synchronizer answered a start step that is none"):
        comms.start(4)
    assert not comms._threads  # nothing was started
