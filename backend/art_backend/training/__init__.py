"""Training: one core on Tinker's primitive (`_trainer`: forward_backward + optim_step on a LoRA
inside the engine's model) and the translations onto it (GRPO, SFT, pipeline, replay; the Tinker
wing's datums), queued one step at a time, with their HTTP routes."""
