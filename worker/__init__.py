"""lane-worker: durable Absurd runs that stay on the release that launched them."""
