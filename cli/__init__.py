"""schedhub.cli."""
