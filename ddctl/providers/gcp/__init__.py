"""The GCP provider: Compute Engine VMs, and what they cost (``prices``)."""
