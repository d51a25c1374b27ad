"""Langfuse export: every trajectory a model trains on or logs becomes a Langfuse trace; with
`LangfuseObserver(review=LangfuseReview(...))`, decisions made in Langfuse on a step held for
review reach the trainer.

    _observer.py          LangfuseObserver: the tracker `report_metrics=["langfuse"]` names
    _exporter.py          LangfuseExporter: the queue and worker that send traces
    _default_exporter.py  the exporter LANGFUSE_* configures; stats and flush over all of them
    _trace.py             a trajectory as a trace (pure functions)
    _wire.py              what goes over the wire (OTLP spans, scores), as the v5 SDK sends it
    _review.py            decisions made in Langfuse on a held step, read back
"""

from art_core.trackers.langfuse._default_exporter import flush_langfuse, langfuse_stats
from art_core.trackers.langfuse._exporter import LangfuseExporter
from art_core.trackers.langfuse._observer import LangfuseObserver
from art_core.trackers.langfuse._review import LangfuseReview

__all__ = [
    "LangfuseExporter",
    "LangfuseObserver",
    "LangfuseReview",
    "flush_langfuse",
    "langfuse_stats",
]
