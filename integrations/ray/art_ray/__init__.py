"""Rollouts on a Ray cluster: `RayExecutor` runs the user's rollout functions in async worker actors."""
