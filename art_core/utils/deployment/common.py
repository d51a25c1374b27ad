"""ART's `art.utils.deployment.common`: the settings every provider shares, the result, and
`deploy_model`, which answers with where the adapter is and how to upload it."""

from __future__ import annotations

from typing import Any, Literal, NoReturn

from pydantic import BaseModel

from art_core._unknown_fields import StrictModel
from art_core.errors import UnsupportedOptionError

__all__ = ["DeploymentConfig", "DeploymentResult", "Provider", "deploy_model", "refusal"]

Provider = Literal["together", "wandb"]

# Provider -> (its hosted service, how to put the adapter folder there yourself).
_UPLOADS: dict[str, tuple[str, str]] = {
    "wandb": (
        "W&B's serverless LoRA inference",
        "upload that folder as a W&B artifact, e.g. `artifact = wandb.Artifact(NAME, "
        "type='lora'); artifact.add_dir(PATH); run.log_artifact(artifact)`",
    ),
    "together": (
        "Together's serverless LoRA inference",
        "upload that folder to Together as a LoRA adapter of the base model (Together's "
        "model upload, from a URL or the Hugging Face Hub)",
    ),
}


class DeploymentConfig(StrictModel):
    """The base of ART's per-provider deployment settings."""


class DeploymentResult(BaseModel):
    """ART's deployment result: the name a hosted service serves the step under."""

    inference_model_name: str


def refusal(provider: str, model: Any, checkpoint_path: str, step: int) -> UnsupportedOptionError:
    """The error a deployment to `provider` raises: where the step is served, where its files are."""
    service, upload = _UPLOADS[provider]
    name = getattr(model, "name", "<name>")
    return UnsupportedOptionError(
        f"art.utils.deployment ({provider}): {service} is a hosted service this library does "
        f"not deploy to. The backend serves this step itself as model={name}@{step} on its "
        f"OpenAI-compatible URL (model.openai_client()); the adapter (PEFT files) is in "
        f"{checkpoint_path}: to publish it, {upload}."
    )


async def deploy_model(
    model: Any,
    checkpoint_path: str,
    step: int,
    provider: Provider,
    config: DeploymentConfig | None = None,
    verbose: bool = False,
) -> NoReturn:
    """ART's signature; raises UnsupportedOptionError naming the adapter's folder and the upload."""
    if provider not in _UPLOADS:
        raise ValueError(f"Unsupported provider: {provider!r}. Use 'together' or 'wandb'.")
    raise refusal(provider, model, checkpoint_path, step)
