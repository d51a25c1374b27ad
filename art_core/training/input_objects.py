"""ART main's `art.training.input_objects`: training inputs referenced by immutable objects.

A batch of trajectories resolves to token rows through the server's records of its
completions; records are evicted after a while, and trajectories are mutable objects. Stored
as an input object, the rows are fixed: `LocalInputStore.put` writes them once, as canonical
JSON named by their SHA-256 (read-only), and `resolve` reads them back only if the bytes are
still the ones the reference names (`TrainingInputMismatchError` otherwise). Training from the
same reference twice trains the identical tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal, Protocol

from art_core.errors import TrainingInputMismatchError
from art_core.training.contracts import (
    OperationRef,
    TrainingInputObject,
    TrainingInputObjectRef,
)

__all__ = ["LocalInputStore", "TrainingInputResolver"]

ENCODING = "art_core_datums_json_v1"


class TrainingInputResolver(Protocol):
    """Reads an input object's rows back, checked against its reference (ART's protocol)."""

    async def resolve(
        self, input_object: TrainingInputObjectRef, *, operation: OperationRef
    ) -> list[dict[str, Any]]: ...


def canonical(rows: list[dict[str, Any]]) -> bytes:
    """The rows as canonical JSON (sorted keys, no spaces): equal rows, equal bytes."""
    return json.dumps(
        {"encoding": ENCODING, "rows": rows}, sort_keys=True, separators=(",", ":")
    ).encode()


class LocalInputStore:
    """Input objects in a folder on this machine (`<folder>/<sha256>.json`, read-only)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    def put(
        self, run_id: str, rows: list[dict[str, Any]], batch_kind: Literal["rl", "sft"]
    ) -> TrainingInputObjectRef:
        """Store `rows` once (an identical object already there is reused) and reference it."""
        data = canonical(rows)
        digest = hashlib.sha256(data).hexdigest()
        path = self.folder / f"{digest}.json"
        if not path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            # Written whole under a temporary name, then renamed: a crash leaves no half object.
            handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".json")
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            os.chmod(temporary, 0o444)
            os.replace(temporary, path)
        return TrainingInputObjectRef(
            run_id=run_id,
            object=TrainingInputObject(
                locator=str(path.resolve()), size_bytes=len(data), sha256=digest
            ),
            batch_kind=batch_kind,
        )

    async def resolve(
        self, input_object: TrainingInputObjectRef, *, operation: OperationRef | None = None
    ) -> list[dict[str, Any]]:
        """The stored rows, after checking size and SHA-256 against the reference."""
        stored = input_object.object
        path = Path(stored.locator)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise TrainingInputMismatchError(
                f"input object {stored.sha256[:12]} cannot be read at {path}: {error}"
            ) from error
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != stored.size_bytes or digest != stored.sha256:
            raise TrainingInputMismatchError(
                f"input object at {path} is not the one referenced (size {len(data)} vs "
                f"{stored.size_bytes}, sha256 {digest[:12]} vs {stored.sha256[:12]}): it was "
                "changed after it was stored; store the batch again (TrainingClient.put_input)"
            )
        document = json.loads(data)
        if document.get("encoding") != ENCODING:
            raise TrainingInputMismatchError(
                f"input object at {path} is encoded {document.get('encoding')!r}, not {ENCODING}"
            )
        rows: list[dict[str, Any]] = document["rows"]
        return rows
