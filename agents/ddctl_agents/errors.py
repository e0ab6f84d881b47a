"""Every error the agents side raises, in one tree (importing this needs no torch).

    AgentError (ValueError)          bad input from a user, a file or a peer
    ├── ConfigError                  a setting outside its allowed range
    ├── CodecError                   unknown codec, bad block, wrong payload size, NaN/Inf
    ├── WireError                    malformed, truncated, oversized or corrupted frame
    ├── FragmentationError           impossible fragment layout
    ├── MergeError                   inconsistent contributions to a merge
    ├── TapeError                    unreadable tape
    └── SyncError                    an update the syncer refuses (``status`` = HTTP code)
        ├── BadUpdate          400   layout does not match the model
        ├── UnknownLearner     409   not registered (or declared gone): register again
        ├── NonFiniteUpdate    422   NaN or Inf in an outer gradient
        ├── OutOfBounds        422   values or counters beyond any plausible inner drift
        ├── Suspended          403   quarantined after repeated bad updates, until readmitted
        └── ImpossibleVersion  409   a base version the syncer never produced

Modules raise these and re-export the ones they own; shells map the tree to
exit codes or HTTP statuses in one place each.
"""

from __future__ import annotations


class AgentError(ValueError):
    """Root of every error caused by bad input on the agents side."""


class ConfigError(AgentError):
    """A setting is out of its allowed range; the message names it and the range."""


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


class SyncError(AgentError):
    """An update the syncer refuses; ``status`` is the HTTP code the service maps it to,
    ``code`` the stable word a client switches on."""

    status = 400
    code = "bad_update"


class BadUpdate(SyncError):
    status = 400


class UnknownLearner(SyncError):
    status = 409
    code = "unknown_learner"


class NonFiniteUpdate(SyncError):
    status = 422
    code = "non_finite"


class OutOfBounds(SyncError):
    status = 422
    code = "out_of_bounds"


class Suspended(SyncError):
    status = 403
    code = "suspended"


class ImpossibleVersion(SyncError):
    status = 409
    code = "impossible_version"


REJECTIONS: dict[str, type[SyncError]] = {cls.code: cls for cls in (BadUpdate, NonFiniteUpdate, OutOfBounds)}
"""The refusals an update's content can earn, by code: each counts against its sender (quarantine)."""
