"""Serving: the OpenAI protocols (Chat Completions, Responses) over one engine, each completion
recorded with its exact tokens."""
