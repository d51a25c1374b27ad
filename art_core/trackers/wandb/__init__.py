"""Weights & Biases: a model's steps as a W&B run, through the wandb SDK (extra `[wandb]`)."""

from art_core.trackers.wandb._observer import WandbObserver, wandb_installed, wandb_tracker

__all__ = ["WandbObserver", "wandb_installed", "wandb_tracker"]
