"""ART's `art.serverless.backend`, where ART's docs import `ServerlessBackend` from: the same
refused name as `art_core.serverless` (OpenPipe's hosted backend is not part of this library)."""

from art_core._refused_art_names import module_getattr

__all__: list[str] = []

__getattr__ = module_getattr("art.serverless", __name__)
