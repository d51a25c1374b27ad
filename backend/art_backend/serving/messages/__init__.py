"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), translated onto chat
completions: the request schema, the translation, the Message objects and stream events written
back (errors in Anthropic's shape), and the routes."""

from art_backend.serving.messages._routes import attach_message_routes

__all__ = ["attach_message_routes"]
