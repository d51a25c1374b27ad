"""The process-wide default exporter: the one the LANGFUSE_* environment variables configure,
which a train or log call uses unless it is given another (`resolve_exporter`), and the counts
and flush over every exporter alive (`art.langfuse_stats()`, `art.flush_langfuse()`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

from art_core.trackers.langfuse._exporter import (
    LIVE_EXPORTERS,
    LangfuseExporter,
    env_configured,
    langfuse_installed,
    require_langfuse,
)

logger = logging.getLogger("art_core.langfuse")

_default: LangfuseExporter | None = None
_default_lock = threading.Lock()
_not_installed_warned = False


def default_exporter() -> LangfuseExporter | None:
    """The exporter the LANGFUSE_* environment variables configure, or None."""
    global _default, _not_installed_warned
    if not env_configured():
        return None
    if not langfuse_installed():
        if not _not_installed_warned:
            _not_installed_warned = True
            logger.warning(
                "LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_HOST are set but the "
                "langfuse SDK is not installed: nothing is exported. pip install "
                "'art-trainer[langfuse]' to export trajectories to Langfuse."
            )
        return None
    with _default_lock:
        if _default is None or _default._closed:
            _default = LangfuseExporter()
        return _default


def resolve_exporter(langfuse: bool | LangfuseExporter | None) -> LangfuseExporter | None:
    """The exporter a train or log call uses: None (off), the default, or the one given.

    `True` asks for export: without the extra or the settings it raises a named error.
    """
    if langfuse is None:
        return default_exporter()
    if langfuse is False:
        return None
    if isinstance(langfuse, LangfuseExporter):
        return langfuse
    require_langfuse()
    exporter = default_exporter()
    if exporter is None:
        LangfuseExporter()  # raises LangfuseConfigError naming what is missing
    return exporter


def reset_default_exporter() -> None:
    """Close and forget the default exporter (the next export builds it anew from LANGFUSE_*)."""
    global _default, _not_installed_warned
    with _default_lock:
        if _default is not None:
            _default.close(timeout=5)
        _default = None
        _not_installed_warned = False


def take_unreported(owner: str) -> Counter[str]:
    """Every exporter's counts of `owner`'s traces since its last step, as step metrics."""
    counts: Counter[str] = Counter()
    for exporter in list(LIVE_EXPORTERS):
        counts.update(exporter.take_unreported(owner))
    return counts


def langfuse_stats() -> dict[str, Any]:
    """The default exporter's counts (exported, dropped, pending traces...); zeros when off."""
    if _default is not None:
        return _default.stats()
    return {
        "exported_traces": 0,
        "dropped_traces": 0,
        "missing_records": 0,
        "pending_traces": 0,
        "last_error": None,
    }


def flush_langfuse(timeout: float | None = 60.0) -> bool:
    """Wait until every exporter has sent (or dropped) what is queued; False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for exporter in list(LIVE_EXPORTERS):
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not exporter.flush(remaining):
            return False
    return True
