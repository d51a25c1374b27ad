"""ART's experimental backend calls on a backend reached over HTTP: the fork (done at
registration here), and the S3 copies, `_path` and deployment, which a remote backend refuses
saying where the files are (`LocalBackend` overrides the ones it can do on its own machine).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from art_core.errors import UnsupportedOptionError

__all__ = ["ArtExperimentalCalls"]

logger = logging.getLogger("art_core.backend")


class ArtExperimentalCalls:
    """RemoteBackend's `_experimental_*` calls and `_path`, as ART 0.5.23 names them."""

    base_url: str

    if TYPE_CHECKING:

        async def checkpoint_steps(self, model: Any) -> list[int]: ...

    async def _experimental_fork_checkpoint(
        self,
        model: Any,
        from_model: str,
        from_project: str | None = None,
        from_s3_bucket: str | None = None,
        not_after_step: int | None = None,
        verbose: bool = False,
        prefix: str | None = None,
    ) -> None:
        """ART's fork, as `await model.register(backend, fork_from=..., fork_step=...)`: registers
        `model` starting from `from_model`'s latest checkpoint (or its last one <= `not_after_step`).

        ART registers first and forks after; here the fork happens at registration, so call this
        in place of `model.register(backend)`. S3 sources are refused (checkpoints are local)."""
        if from_s3_bucket is not None or prefix is not None:
            raise UnsupportedOptionError(
                "_experimental_fork_checkpoint: from_s3_bucket/prefix are not supported: the source "
                "must be a model in this backend's folder."
            )
        if getattr(model, "_backend", None) is not None:
            raise UnsupportedOptionError(
                f"_experimental_fork_checkpoint: {model!r} is already registered. Fork when "
                "registering: call this instead of model.register(backend), or "
                "`await model.register(backend, fork_from=source_model, fork_step=step)`."
            )
        source = SimpleNamespace(
            project=from_project or model.project, name=from_model, base_model=model.base_model
        )
        step = None
        if not_after_step is not None:
            steps = [s for s in await self.checkpoint_steps(source) if s <= not_after_step]
            if not steps:
                raise UnsupportedOptionError(
                    f"_experimental_fork_checkpoint: {source.project}/{from_model} has no "
                    f"checkpoint at or before step {not_after_step}."
                )
            step = steps[-1]
        await model.register(self, fork_from=source, fork_step=step)
        if verbose:
            logger.info(
                "Forked %s from %s/%s step %s", model.name, source.project, from_model, step
            )

    @property
    def _path(self) -> str:
        """ART's `backend._path`: not known to a client of a remote backend (refused)."""
        raise UnsupportedOptionError(
            f"backend._path: the models' files are on the machine of the backend at "
            f"{self.base_url}, in its `art-server --path` folder (<path>/<project>/models/<name>/)."
        )

    async def _experimental_push_to_s3(self, model: Any, **options: Any) -> None:
        """ART's S3 copy: refused here, saying where the files are (LocalBackend copies)."""
        raise UnsupportedOptionError(_REMOTE_FILES.format(url=self.base_url, model=model))

    async def _experimental_pull_from_s3(self, model: Any, **options: Any) -> None:
        """ART's S3 copy: refused here, saying where the files go (LocalBackend copies)."""
        raise UnsupportedOptionError(_REMOTE_FILES.format(url=self.base_url, model=model))

    async def _experimental_deploy(self, *args: Any, **kwargs: Any) -> None:
        """ART's deployment to a hosted provider (Together, W&B): refused, saying what serves."""
        raise UnsupportedOptionError(
            "_experimental_deploy: deploying to a hosted provider is not part of this library: "
            f"the backend at {self.base_url} serves every step itself (model=<name>@<step>, "
            "model.openai_client()); a step's adapter is in its checkpoint folder "
            "(TrainResult.checkpoint_path)."
        )


_REMOTE_FILES = (
    "_experimental_push_to_s3 / _experimental_pull_from_s3 copy a model's folder on this "
    "machine: the files of {model.name!r} are on the machine of the backend at {url}, in "
    "<art-server --path>/{model.project}/models/{model.name}/; copy that folder there (e.g. "
    "`aws s3 sync`), or use art.LocalBackend(), which copies to and from any fsspec URL."
)
