"""schedhub.tuner."""
