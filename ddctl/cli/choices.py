"""The choices flags offer, made from the lists the agents define (never written out twice)."""

from __future__ import annotations

from enum import StrEnum

from ddctl_agents.core.choices import CODECS, DOWN_CODECS, MERGES, STRATEGIES

Codec = StrEnum("Codec", {name: name for name in CODECS})  # type: ignore[misc]
Merge = StrEnum("Merge", {name: name for name in MERGES})  # type: ignore[misc]
Fragmentation = StrEnum("Fragmentation", {name: name for name in STRATEGIES})  # type: ignore[misc]
DownCodec = StrEnum("DownCodec", {name: name for name in DOWN_CODECS})  # type: ignore[misc]
