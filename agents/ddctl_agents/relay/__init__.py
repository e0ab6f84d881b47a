"""A region's relay: it pulls each fragment version into the region once and serves it to the region's learners."""
