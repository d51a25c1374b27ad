"""art_backend: the serving and training backend (torch, transformers, peft)."""
