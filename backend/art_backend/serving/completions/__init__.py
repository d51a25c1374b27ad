"""OpenAI's legacy Completions API (POST /v1/completions): text or token ids in, continuations
out, no chat template (how a base model is served); recorded as chat completions are."""

from art_backend.serving.completions._routes import attach_completion_routes

__all__ = ["attach_completion_routes"]
