"""The control plane: plan, up, down, the controller, local state, the run directory, credentials, chaos."""
