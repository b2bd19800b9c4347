"""schedhub.hooks."""
