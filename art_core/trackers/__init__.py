"""Trackers: what watches a model's steps (Langfuse export, a user's own `StepObserver`)."""
