"""ART's `art.serverless`: OpenPipe's hosted backend, which this library does not include.

`from art_core.serverless import ServerlessBackend` imports; using it raises
`UnsupportedOptionError` saying to use `art.LocalBackend()` or `art.RemoteBackend(url)`
(the reason is in `art_core/_refused_art_names.py`).
"""

from art_core._refused_art_names import module_getattr

__all__: list[str] = []

__getattr__ = module_getattr("art.serverless", __name__)
