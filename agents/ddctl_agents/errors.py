"""Every error the agents side raises, in one tree (importing this needs no torch).

    AgentError                       bad input from a user, a file or a peer (never a bug: not a ValueError)
    ├── ConfigError                  a setting outside its allowed range
    │   ├── ContractError            a model that breaks the model contract (train/contract.py); ``rule`` names which
    │   ├── CheckpointError          a checkpoint that cannot be used: damaged, partial, out of range (bad data)
    │   └── OutOfMemory              an inner step the settings make larger than the device's memory
    ├── CodecError                   unknown codec, bad block, wrong payload size, NaN/Inf
    ├── WireError                    malformed, truncated, oversized or corrupted frame
    ├── FragmentationError           impossible fragment layout
    ├── MergeError                   inconsistent contributions to a merge
    ├── TapeError                    unreadable tape
    ├── LogError                     the write-ahead log: a record that could not be read back, or replayed
    │   └── Unreplayable             a record recovery sets aside (carries the core's effects)
    ├── RequestError                 a request the syncer refuses; HTTP status and code from HTTP below
    │   ├── BadRequest               a field of the wrong type, out of bounds, or unknown
    │   ├── Unauthorized             no token, or one the job's secret did not sign
    │   ├── Forbidden                a valid token used for someone else, or an admin-only action
    │   ├── NotFound, MethodNotAllowed, TooLarge, ClientGone
    │   ├── JobOver                  the job is finishing or finished: no one joins any more
    │   ├── NotOwner                 a sharded synchronizer's shard that does not own the fragment (owner, epoch)
    │   ├── UpstreamDown             a relay whose streams from the shards broke (its learners pull from them)
    │   └── SyncError                an update the core refuses
    │       ├── BadUpdate            layout does not match the fragment
    │       ├── UnknownLearner       not registered (or declared gone): register again
    │       ├── NonFiniteUpdate      NaN or Inf in an outer gradient
    │       ├── OutOfBounds          values or counters beyond any plausible inner drift
    │       ├── Suspended            quarantined after repeated bad updates, until readmitted
    │       └── ImpossibleVersion    a base version the syncer never produced
    └── PeerError                    what a learner's client learns from the syncer
        ├── Refused                  a 4xx answer (status, code, reason): retrying it unchanged will not help
        └── Unavailable              no answer, a timeout or a 5xx: worth retrying

``HTTP`` is the one table from refusal to (status, code); the service answers
with it and the client reads the code back. Modules raise these and re-export
the ones they own; shells map the tree to exit codes or HTTP statuses in one
place each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class AgentError(Exception):
    """Root of every error caused by bad input on the agents side."""

    @property
    def status(self) -> int:
        """The HTTP status this error is answered with (400 when it is not a refusal of its own)."""
        return http_of(self)[0]

    @property
    def code(self) -> str:
        """The stable word a client switches on."""
        return http_of(self)[1]


class ConfigError(AgentError):
    """A setting is out of its allowed range; the message names it and the range."""


class ContractError(ConfigError):
    """A model factory or its model breaks one rule of the contract (``ddctl_agents.train.contract``)."""

    def __init__(self, message: str, rule: str = "contract") -> None:
        super().__init__(f"model contract, rule {rule!r}: {message}")
        self.rule = rule


class OutOfMemory(ConfigError):
    """An inner step did not fit in the device's memory: the batch and the model ask for more than the machine has."""


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used, and why: a damaged or partial file, a manifest out of type or range, tensors
    that are not the model's. Never a half-loaded model; the shells report it as bad input data (exit 3)."""


class CodecError(AgentError):
    """Bad codec name or block size, wrong payload size, or non-finite input."""


class WireError(AgentError):
    """A frame is malformed, truncated, oversized, inconsistent or corrupted."""


class FragmentationError(AgentError):
    """The requested layout is impossible (e.g. more fragments than tensors)."""


class MergeError(AgentError):
    """Inputs to a merge are inconsistent (no weight, mismatched shapes, bad method)."""


class TapeError(AgentError):
    """The tape cannot be read or replayed; the message names the line."""


class LogError(AgentError):
    """A write-ahead log record that could never be read back is refused before it is written."""


class Unreplayable(LogError):
    """A log record the live path would not have applied; ``effects`` are what the core did about it."""

    def __init__(self, reason: str, effects: Iterable[Any] = ()) -> None:
        super().__init__(reason)
        self.effects = list(effects)


class RequestError(AgentError):
    """A request the syncer refuses; ``HTTP`` gives its status and code."""


class BadRequest(RequestError):
    """A request field has the wrong type, is out of its bounds, or is unknown."""


class Unauthorized(RequestError):
    """No token, or one the job's secret did not sign."""


class Forbidden(RequestError):
    """A valid token used for someone else's identity, or for an action only the admin may take."""


class NotFound(RequestError):
    """No such endpoint or fragment."""


class MethodNotAllowed(RequestError):
    """The endpoint exists, with other methods."""


class TooLarge(RequestError):
    """A body over the service's limit (by its content-length or as it arrives)."""


class ClientGone(RequestError):
    """The client went away mid-request: nothing is left to answer."""


class JobOver(RequestError):
    """The job is finishing or has finished: a learner may not join (it should exit, its work is done)."""


class NotOwner(RequestError):
    """This shard does not own the fragment: the update is not applied; ``details`` name the owner and map epoch."""

    def __init__(self, reason: str, owner: str = "", epoch: int = 0) -> None:
        super().__init__(reason)
        self.details = {"owner": owner, "epoch": epoch}


class UpstreamDown(RequestError):
    """A region's relay has not heard from a shard lately: its learners pull from the shards themselves meanwhile."""


class SyncError(RequestError):
    """An update the syncer's core refuses."""


class BadUpdate(SyncError):
    """The update's layout does not match the fragment."""


class UnknownLearner(SyncError):
    """Not registered, or declared gone: register again."""


class NonFiniteUpdate(SyncError):
    """NaN or Inf in an outer gradient."""


class OutOfBounds(SyncError):
    """Values or counters beyond any plausible inner drift."""


class Suspended(SyncError):
    """Quarantined after repeated bad updates, until an operator readmits the learner."""


class ImpossibleVersion(SyncError):
    """A base version the syncer never produced."""


class PeerError(AgentError):
    """What a learner's client learns from (or about) the syncer."""


class Refused(PeerError):
    """The syncer answered 4xx: the request itself is wrong, retrying it unchanged will not help."""

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(f"{status} {code}: {reason}")
        self.answer, self.reason = (status, code), reason

    @property
    def status(self) -> int:
        return self.answer[0]

    @property
    def code(self) -> str:
        return self.answer[1]


class Unavailable(PeerError):
    """The syncer could not be reached, timed out or failed (5xx): worth retrying."""


HTTP: dict[type[AgentError], tuple[int, str]] = {
    BadRequest: (400, "bad_request"),
    Unauthorized: (401, "unauthorized"),
    Forbidden: (403, "forbidden"),
    NotFound: (404, "not_found"),
    MethodNotAllowed: (405, "method_not_allowed"),
    TooLarge: (413, "too_large"),
    ClientGone: (499, "client_gone"),
    JobOver: (410, "job_over"),
    NotOwner: (409, "not_owner"),
    UpstreamDown: (503, "upstream_down"),
    SyncError: (400, "bad_update"),
    BadUpdate: (400, "bad_update"),
    UnknownLearner: (409, "unknown_learner"),
    NonFiniteUpdate: (422, "non_finite"),
    OutOfBounds: (422, "out_of_bounds"),
    Suspended: (403, "suspended"),
    ImpossibleVersion: (409, "impossible_version"),
    AgentError: (400, "bad_request"),
}
"""Every refusal's HTTP status and stable code; the nearest class in an error's MRO wins."""

REJECTIONS: dict[str, type[SyncError]] = {HTTP[cls][1]: cls for cls in (BadUpdate, NonFiniteUpdate, OutOfBounds)}
"""The refusals an update's content can earn, by code: each counts against its sender (quarantine)."""


def http_of(exc: AgentError) -> tuple[int, str]:
    for cls in type(exc).__mro__:
        if cls in HTTP:
            return HTTP[cls]
    return HTTP[AgentError]
