"""Configuration on one path: regions.yaml, the training knobs and the one JobConfig builder."""
