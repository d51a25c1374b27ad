"""ART's `art.tinker`: `TinkerBackend`, ART code trained through the Tinker API of an art-server.

ART's `TinkerBackend` is its LocalBackend with training on Tinker; here it is
`art_core.tinker_native.TinkerNativeBackend` under ART's constructor (`in_process=` is accepted
and has no effect: the server is its own process). `get_renderer_name` and
`OpenAICompatibleTinkerServer` import; using one raises `UnsupportedOptionError` saying what to
use (`art_core/_refused_art_names.py`).
"""

from __future__ import annotations

from art_core._refused_art_names import module_getattr
from art_core.tinker_native import TinkerNativeBackend

__all__ = ["TinkerBackend"]


class TinkerBackend(TinkerNativeBackend):
    """ART's `art.tinker.TinkerBackend(tinker_api_key=, in_process=, path=)`."""

    def __init__(
        self,
        *,
        tinker_api_key: str | None = None,
        in_process: bool = False,
        path: str | None = None,
        base_url: str | None = None,
    ) -> None:
        super().__init__(tinker_api_key=tinker_api_key, path=path, base_url=base_url)
        self.in_process = in_process


__getattr__ = module_getattr("art.tinker", __name__)
