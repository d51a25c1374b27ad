"""Langfuse export: every trajectory a model trains on or logs becomes a Langfuse trace."""

from art_core.trackers.langfuse._export import (
    LangfuseExporter,
    LangfuseObserver,
    flush_langfuse,
    langfuse_stats,
)

__all__ = ["LangfuseExporter", "LangfuseObserver", "flush_langfuse", "langfuse_stats"]
