"""Retention (issue 20): plan and apply the rules' sweep in batches, vacuum, schedule."""
