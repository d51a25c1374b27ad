"""Serving: the protocols over one engine, each in its own room (Chat Completions, Completions,
Responses, Anthropic's Messages; the last two translated onto chat completions), over one request
base and one way of answering, each completion recorded with its exact tokens."""
