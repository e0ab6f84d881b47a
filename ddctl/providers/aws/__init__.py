"""The ``aws`` provider: EC2 spot instances with boto3 (imported lazily), found again by their tags."""
