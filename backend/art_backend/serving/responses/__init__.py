"""OpenAI's Responses API (POST /v1/responses), translated onto chat completions: the request
schema, the translation and the stored responses (`previous_response_id`), the Response objects
and stream events written back, and the routes."""

from art_backend.serving.responses._routes import attach_response_routes

__all__ = ["attach_response_routes"]
