"""A disk cache of validated judge and generator answers, keyed by a hash of the whole request.

The key covers the model (URL and served name), the messages (so the rubric and every
trajectory), the output schema and the sampling options: any change is a miss, and re-running an
identical step costs no request. Entries are single JSON files written atomically, so concurrent
writers and a crash mid-write never leave a torn entry; a corrupt file reads as a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

CACHE_DIR_VARIABLE = "ART_CACHE_DIR"


def default_cache_dir() -> Path:
    """`$ART_CACHE_DIR/judge`, else `~/.cache/art-trainer/judge`."""
    root = os.environ.get(CACHE_DIR_VARIABLE)
    base = Path(root) if root else Path.home() / ".cache" / "art-trainer"
    return base / "judge"


class ResponseCache:
    """Validated answers on disk: `get(key)` / `put(key, value)`; `key(...)` hashes a request."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_cache_dir()

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.folder)!r})"

    @staticmethod
    def key(request: dict[str, Any]) -> str:
        canonical = json.dumps(request, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            value = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(handle, "w") as out:
                json.dump(value, out, ensure_ascii=False)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def resolve_cache(cache: bool | str | Path | ResponseCache | None) -> ResponseCache | None:
    """`True`: the default folder; a path: that folder; `False`/`None`: no cache."""
    if cache is None or cache is False:
        return None
    if cache is True:
        return ResponseCache()
    if isinstance(cache, ResponseCache):
        return cache
    return ResponseCache(cache)
