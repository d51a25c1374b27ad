"""Training: GRPO and SFT steps on a LoRA adapter inside the engine's model, queued one at a time,
with their HTTP routes."""
