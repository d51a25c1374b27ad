"""ART's `art.utils.deployment`: uploading a LoRA step to a hosted inference service (W&B's or
Together's serverless LoRA inference). Hosting is not part of this library: the backend serves
every step itself as `<name>@<step>`, so `deploy_model` and `deploy_wandb` raise
`UnsupportedOptionError` saying where the adapter is and how to upload it yourself. The settings
classes construct as ART's do, so a ported script fails at the deploy call, with that sentence.
"""

from art_core.utils.deployment.common import (
    DeploymentConfig,
    DeploymentResult,
    Provider,
    deploy_model,
)
from art_core.utils.deployment.legacy import LoRADeploymentJob, LoRADeploymentProvider
from art_core.utils.deployment.together import TogetherDeploymentConfig
from art_core.utils.deployment.wandb import WandbDeploymentConfig, deploy_wandb

__all__ = [
    "DeploymentConfig",
    "DeploymentResult",
    "LoRADeploymentJob",
    "LoRADeploymentProvider",
    "Provider",
    "TogetherDeploymentConfig",
    "WandbDeploymentConfig",
    "deploy_model",
    "deploy_wandb",
]
