"""art_core: the client library (no torch)."""
