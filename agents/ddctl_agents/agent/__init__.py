"""The learner agent: trains with torch and talks to the syncer over HTTP/2."""
