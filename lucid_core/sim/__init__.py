"""Event-driven trace simulator: the second driver of the policy core."""
