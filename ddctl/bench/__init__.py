"""``ddctl bench``: codec, quality, transport, round and link measurements, each against its baseline in the same run."""
