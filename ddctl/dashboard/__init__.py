"""The run dashboard: ``ddctl status`` (one snapshot, or JSON) and ``ddctl status --watch`` (live)."""
