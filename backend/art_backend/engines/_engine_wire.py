"""The engine seam over HTTP, for an engine replica on another host.

`art-server --replica-api` answers it (`serving._engine_routes`); `_remote_engine.RemoteEngine`
calls it from the server in front (`art-server --replica-url URL`). It carries exactly what the
seam carries (`_engine`), nothing rendered and nothing recorded: the server in front keeps the
chat template, the records and the trainer; the replica only decodes.

  GET    /v1/engine                    the replica's model: vocabulary size and fingerprint,
                                       context length, adapters served (checked at start)
  POST   /v1/engine/generate           a `GenerationRequest` as JSON in, its events out, one
                                       JSON object a line (`application/x-ndjson`); closing the
                                       connection cancels the request's rows
  PUT    /v1/engine/adapters/{name}    a LoRA folder as a tar archive of its two files
                                       (adapter_config.json, adapter_model.safetensors): the
                                       replica serves it as `name`, in place if it already does
  DELETE /v1/engine/adapters/{name}    stop serving it

An event line is `{"token": [choice, token id, logprob, [[id, logprob], ...], text]}` or
`{"finish": {...}}` (a `FinishEvent`'s fields). Every route needs the server's API key.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from art_backend._errors import InvalidRequestError
from art_backend.engines._engine import FinishEvent, GenerationRequest, TokenEvent

ENGINE_PATH = "/v1/engine"
NDJSON = "application/x-ndjson"
TAR = "application/x-tar"
# What a LoRA folder holds that an engine reads; nothing else crosses (no README, no optimizer).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def request_body(request: GenerationRequest) -> dict[str, Any]:
    """What POST /v1/engine/generate takes for `request` (its grammar as text, not a matcher)."""
    params = asdict(request.params)
    params["logit_bias"] = {str(token): bias for token, bias in request.params.logit_bias.items()}
    return {
        "prompt_ids": request.prompt_ids,
        "n": request.n,
        "adapter": request.adapter,
        "stream_tokens": request.stream_tokens,
        "session": request.session,
        "params": params,
    }


def event_line(event: TokenEvent | FinishEvent) -> bytes:
    """One event as one line of the stream."""
    if isinstance(event, TokenEvent):
        payload: dict[str, Any] = {
            "token": [
                event.choice_index,
                event.token_id,
                event.logprob,
                event.top_logprobs,
                event.text_delta,
            ]
        }
    else:
        payload = {"finish": asdict(event)}
    return json.dumps(payload).encode() + b"\n"  # ASCII: no line break inside a line


def event_from(line: str | bytes) -> TokenEvent | FinishEvent:
    """The event a stream line holds (ValueError when it holds none)."""
    payload = json.loads(line)
    if "token" in payload:
        choice, token, logprob, top, text = payload["token"]
        pairs = [(int(pair[0]), float(pair[1])) for pair in top]
        return TokenEvent(int(choice), int(token), float(logprob), pairs, str(text))
    if "finish" in payload:
        finish = dict(payload["finish"])
        finish["top_logprobs"] = [
            [(int(pair[0]), float(pair[1])) for pair in row] for row in finish["top_logprobs"]
        ]
        return FinishEvent(**finish)
    raise ValueError(f"not an engine event: {str(line)[:200]!r}")


def adapter_archive(folder: Path) -> bytes:
    """The tar archive PUT /v1/engine/adapters/{name} takes: the folder's `ADAPTER_FILES`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ADAPTER_FILES:
            path = Path(folder) / name
            if not path.is_file():
                raise InvalidRequestError(
                    f"Cannot send the adapter at {str(folder)!r} to a replica: it has no {name}.",
                    param="path",
                )
            archive.add(path, arcname=name, recursive=False)
    return buffer.getvalue()


def unpack_adapter(archive: bytes, folder: Path) -> None:
    """Write the archive's `ADAPTER_FILES` into `folder` (made here); anything else in the
    archive (another name, a link, a folder, a path) is a 400 and nothing is written."""

    def refuse(problem: str) -> InvalidRequestError:
        return InvalidRequestError(
            f"The adapter archive {problem}; send a tar of {' and '.join(ADAPTER_FILES)} only.",
            param="body",
        )

    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            members = tar.getmembers()
            names = [member.name for member in members]
            for member in members:
                if member.name not in ADAPTER_FILES:
                    raise refuse(f"holds {member.name[:100]!r}")
                if not member.isfile():
                    raise refuse(f"holds {member.name!r} as something other than a plain file")
            if sorted(names) != sorted(ADAPTER_FILES):
                raise refuse(f"holds {names} (each file once)")
            folder.mkdir(parents=True)
            for member in members:
                source = tar.extractfile(member)
                assert source is not None  # a plain file, checked above
                (folder / member.name).write_bytes(source.read())
    except (tarfile.TarError, EOFError) as error:
        raise refuse(f"is not a readable tar archive ({error})") from error


def vocabulary_fingerprint(tokenizer: Any) -> str:
    """A digest of the tokenizer's vocabulary: two servers that agree on it tokenize alike."""
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocabulary, ensure_ascii=False).encode()).hexdigest()[:32]
