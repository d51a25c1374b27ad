"""Langfuse export: every trajectory a model trains on or logs becomes a Langfuse trace; with
`LangfuseObserver(review=LangfuseReview(...))`, decisions made in Langfuse on a step held for
review reach the trainer."""

from art_core.trackers.langfuse._export import (
    LangfuseExporter,
    LangfuseObserver,
    flush_langfuse,
    langfuse_stats,
)
from art_core.trackers.langfuse._review import LangfuseReview

__all__ = [
    "LangfuseExporter",
    "LangfuseObserver",
    "LangfuseReview",
    "flush_langfuse",
    "langfuse_stats",
]
