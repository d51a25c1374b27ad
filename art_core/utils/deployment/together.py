"""ART's `art.utils.deployment.together`: the settings of a deployment to Together."""

from __future__ import annotations

from art_core.utils.deployment.common import DeploymentConfig

__all__ = ["TogetherDeploymentConfig"]


class TogetherDeploymentConfig(DeploymentConfig):
    """ART's Together deployment settings (`deploy_model(..., provider="together")` refuses)."""

    s3_bucket: str | None = None
    prefix: str | None = None
    wait_for_completion: bool = True
