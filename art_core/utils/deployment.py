"""ART's `art.utils.deployment`: `deploy_wandb`, which uploads a LoRA step to W&B's hosted
(serverless) inference. Hosting is not part of this library: the backend serves every step
itself as `<name>@<step>`, and the call says where the adapter is and how to upload it.
"""

from __future__ import annotations

from typing import Any, NoReturn

from art_core.errors import UnsupportedOptionError

__all__ = ["deploy_wandb"]


def deploy_wandb(
    model: Any,
    checkpoint_path: str,
    step: int,
    config: Any = None,
    verbose: bool = False,
) -> NoReturn:
    """ART's signature; raises UnsupportedOptionError naming the adapter's folder."""
    name = getattr(model, "name", "<name>")
    raise UnsupportedOptionError(
        "art.utils.deployment.deploy_wandb: W&B's serverless LoRA inference is a hosted "
        f"service this library does not deploy to. The backend serves this step itself as "
        f"model={name}@{step} on its OpenAI-compatible URL (model.openai_client()); the "
        f"adapter (PEFT files) is in {checkpoint_path}: to publish it on W&B, upload that "
        "folder as an artifact, e.g. `artifact = wandb.Artifact(NAME, type='lora'); "
        "artifact.add_dir(PATH); run.log_artifact(artifact)`."
    )
