"""The Tinker API's sessions: what `ServiceClient` opens, and what `RestClient` lists of them.

A session is opened by the SDK's `create_session` (with the caller's `user_metadata`); the
training runs and sampling sessions it creates name it. `list_sessions` answers session ids
newest first, `get_session` a session's training run ids, sampler ids and metadata. Sessions are
kept in the run index (`_run_index`), so they are listed after a restart too (their sampling
sessions then no longer sample: those lived in the old process).
"""

from __future__ import annotations

import uuid
from typing import Any

from art_backend._errors import NotFoundError
from art_backend.tinker._run_index import RunIndex, SessionRecord


class TinkerSessions:
    """Sessions over the run index."""

    def __init__(self, index: RunIndex):
        self.index = index

    def create(self, user_metadata: dict[str, Any] | None) -> str:
        """Open a session; its id."""
        session_id = f"session-{uuid.uuid4().hex[:16]}"
        metadata = None if user_metadata is None else {k: str(v) for k, v in user_metadata.items()}
        self.index.put_session(SessionRecord(session_id, metadata))
        return session_id

    def add_sampler(self, session_id: str, sampler_id: str) -> None:
        """Note a sampling session opened in `session_id` (one of another server's sessions,
        or of before the index kept sessions, is opened here on the way)."""
        session = self.index.sessions.get(session_id) or SessionRecord(session_id)
        session.sampler_ids.append(sampler_id)
        self.index.put_session(session)

    def sessions(self, limit: int, offset: int) -> dict[str, Any]:
        """The SDK's ListSessionsResponse: session ids, newest first."""
        ordered = sorted(self.index.sessions.values(), key=lambda row: row.created, reverse=True)
        return {"sessions": [row.session_id for row in ordered[offset : offset + limit]]}

    def session(self, session_id: str) -> dict[str, Any]:
        """The SDK's GetSessionResponse: the session's training runs, samplers and metadata."""
        session = self.index.sessions.get(session_id)
        if session is None:
            raise NotFoundError(
                f"No session {session_id!r} on this server; rest_client.list_sessions lists them."
            )
        runs = [
            record.model_id
            for record in sorted(self.index.records.values(), key=lambda row: row.created)
            if record.session_id == session_id
        ]
        return {
            "training_run_ids": runs,
            "sampler_ids": list(session.sampler_ids),
            "user_metadata": session.user_metadata,
        }
