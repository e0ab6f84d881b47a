"""A region's relay: it pulls each fragment version into the region once and serves it to the region's learners."""

PREFIX = "relay-"


def identity(region: str) -> str:
    """Who region ``region``'s relay is to the shards (its token's identity): ``relay-REGION``."""
    return f"{PREFIX}{region}"


def region_of(who: str) -> str | None:
    """The region whose relay ``who`` is, or None for anyone else."""
    return who[len(PREFIX) :] if who.startswith(PREFIX) and len(who) > len(PREFIX) else None


def server_name(region: str) -> str:
    """The one name region ``region``'s relay certificate carries, which its learners check (``sni_hostname``): the
    relay's address is not known when the job's certificates are made, and need not be."""
    return f"relay.{region}.ddctl"
