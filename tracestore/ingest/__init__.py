"""Raw document -> validated -> projected rows -> store, in one transaction per rollout."""
