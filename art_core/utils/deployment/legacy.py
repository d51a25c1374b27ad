"""ART's `art.utils.deployment.legacy`: the deployment names of ART before `deploy_model`."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel

__all__ = ["LoRADeploymentJob", "LoRADeploymentProvider"]


class LoRADeploymentProvider(StrEnum):
    """ART's old provider names (`deploy_model(provider=...)` takes the strings)."""

    TOGETHER = "together"
    WANDB = "wandb"


class LoRADeploymentJob(BaseModel):
    """ART's old deployment job record, read from a provider's answer."""

    status: Literal["Queued", "Running", "Complete", "Failed"]
    job_id: str
    model_name: str
    failure_reason: str | None
