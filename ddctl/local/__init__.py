"""What runs entirely on this machine: the virtual cluster, training and replay, the data-parallel
baseline, a syncer process."""
