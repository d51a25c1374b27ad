"""Chat Completions (POST /v1/chat/completions): the request schema, the chat service every other
protocol translates onto (prompt tokens, engine work, the exact-token records), and its routes."""

from art_backend.serving.chat._routes import attach_chat_routes

__all__ = ["attach_chat_routes"]
