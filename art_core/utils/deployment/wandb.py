"""ART's `art.utils.deployment.wandb`: `deploy_wandb`, which uploads a LoRA step to W&B's hosted
(serverless) inference; here it says where the adapter is and how to upload it."""

from __future__ import annotations

from typing import Any, NoReturn

from art_core.utils.deployment.common import DeploymentConfig, refusal

__all__ = ["WandbDeploymentConfig", "deploy_wandb"]


class WandbDeploymentConfig(DeploymentConfig):
    """ART's W&B deployment settings: the model's training provenance."""

    provenance: list[str]


def deploy_wandb(
    model: Any,
    checkpoint_path: str,
    step: int,
    config: WandbDeploymentConfig | None = None,
    verbose: bool = False,
) -> NoReturn:
    """ART's signature; raises UnsupportedOptionError naming the adapter's folder."""
    raise refusal("wandb", model, checkpoint_path, step)
