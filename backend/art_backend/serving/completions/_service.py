"""Completions (OpenAI's legacy API): text or token ids in, their continuations out.

No chat template is involved: this is how a base model is served, and how a plain-text
rollout (`Question: ... Answer:`) gets trainable tokens. A request of P prompts and `n` becomes
P engine requests of `n` choices each; the answer numbers its choices prompt by prompt
(`index = p * n + j`, as OpenAI does). The completion is recorded as a chat completion is (the
same store, under its id and the rollout id), so training finds the exact tokens by a choice's
`completion_id` and index:

    {"id", "object": "text_completion", "model", "rollout_id", "request", "prompt_token_ids",
     "choices": [{"index", "text", "finish_reason", "token_ids", "logprobs",
                  "prompt_token_ids" (only when the request had several prompts)}], "usage", ...}

The top-level `prompt_token_ids` is the first prompt's (usually the only one); with several
prompts each choice carries its own, as vLLM's completion choices do. The answer has the same
fields beside OpenAI's, and `completion_id` on each choice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from art_backend._errors import ContextLengthError, InvalidRequestError
from art_backend.engines._engine import FinishEvent, GenerationRequest, TokenEvent
from art_backend.serving._request import parse_request
from art_backend.serving._sampling_params import sampling_params
from art_backend.serving._sse import sse_error, sse_json
from art_backend.serving.chat._service import ChatService, raise_if_failed
from art_backend.serving.completions._schemas import CompletionRequest

Finished = dict[tuple[int, int], FinishEvent]  # (prompt number, choice of that prompt) -> event


@dataclass
class PreparedCompletion:
    """A request made ready for the engine: one generation per prompt, and what `echo` repeats."""

    generations: list[GenerationRequest]
    echoed: list[str]  # per prompt: its text when `echo`, else ""


@dataclass
class _Answered:
    """A request the engine finished: the answer's id and time, the request, its prompts and
    each choice's finish event (what the answer and its record are both written from)."""

    completion_id: str
    created: int
    request: CompletionRequest
    prepared: PreparedCompletion
    finished: Finished


class CompletionsService:
    """Serves POST /v1/completions with the chat service's engine, names, records and workers."""

    def __init__(self, chat: ChatService) -> None:
        self.chat = chat

    def parse(self, body: bytes) -> CompletionRequest:
        """The request in a body, validated (a 400 naming the field otherwise)."""
        return parse_request(CompletionRequest, body)

    # ---------------------------------------------------------------------------------- prepare

    def prepare(self, request: CompletionRequest) -> PreparedCompletion:
        """Check the prompts against the model and build one engine request per prompt."""
        adapter = self.chat.resolve_adapter(request.model)
        engine = self.chat.engine
        params = sampling_params(
            request,
            engine.vocab_size,
            max_new_tokens=1,  # set per prompt below
            top_logprobs=request.logprobs or 0,
        )
        prompts = request.prompts
        generations, echoed = [], []
        for number, prompt in enumerate(prompts):
            where = f"prompt[{number}]" if len(prompts) > 1 else "prompt"
            prompt_ids = self._prompt_ids(prompt, where, request.add_special_tokens)
            generations.append(
                GenerationRequest(
                    prompt_ids=prompt_ids,
                    params=dataclasses.replace(
                        params, max_new_tokens=self._max_new_tokens(prompt_ids, where, request)
                    ),
                    n=request.n,
                    adapter=adapter,
                )
            )
            if request.echo:
                text = prompt if isinstance(prompt, str) else engine.tokenizer.decode(prompt)
                echoed.append(text)
            else:
                echoed.append("")
        return PreparedCompletion(generations, echoed)

    def _prompt_ids(self, prompt: str | list[int], where: str, special_tokens: bool) -> list[int]:
        engine = self.chat.engine
        context = engine.context_length
        if isinstance(prompt, str):
            # No token is longer than this: a longer text cannot fit, whatever it tokenizes to.
            limit = context * self.chat.longest_token_chars
            if len(prompt) > limit:
                raise ContextLengthError(
                    f"{where} holds {len(prompt):,} characters, more than this model's context "
                    f"of {context} tokens can hold (at most {limit:,}). Shorten it.",
                    param="prompt",
                )
            prompt_ids = engine.tokenizer.encode(prompt, add_special_tokens=special_tokens)
        else:
            prompt_ids = list(prompt)
            outside = [token for token in prompt_ids if token >= engine.vocab_size]
            if outside:
                raise InvalidRequestError(
                    f"{where} holds token {outside[0]}, outside the vocabulary "
                    f"[0, {engine.vocab_size}).",
                    param="prompt",
                )
        if not prompt_ids:
            raise InvalidRequestError(
                f"{where} is empty once tokenized: a completion needs at least one token to "
                "continue. Send some text, or token ids.",
                param="prompt",
            )
        return prompt_ids

    def _max_new_tokens(self, prompt_ids: list[int], where: str, request: CompletionRequest) -> int:
        context = self.chat.engine.context_length
        if request.max_tokens is None:
            if len(prompt_ids) >= context:
                raise ContextLengthError(
                    f"{where} has {len(prompt_ids)} tokens, which fills the model's context of "
                    f"{context} tokens. Shorten it.",
                    param="prompt",
                )
            return context - len(prompt_ids)
        if len(prompt_ids) + request.max_tokens > context:
            raise ContextLengthError(
                f"This model's maximum context length is {context} tokens. {where} has "
                f"{len(prompt_ids)} tokens and max_tokens is {request.max_tokens}, "
                f"{len(prompt_ids) + request.max_tokens} in all. Lower max_tokens or shorten "
                "the prompt.",
                param="max_tokens",
            )
        return request.max_tokens

    async def _prepare_off_loop(self, request: CompletionRequest) -> PreparedCompletion:
        # Tokenizing runs on the chat service's workers (the large lane for large bodies).
        self.chat.preparing += 1
        try:
            return await self.chat._off_loop(request, self.prepare, request)
        finally:
            self.chat.preparing -= 1

    # ---------------------------------------------------------------------------------- answers

    async def complete(self, request: CompletionRequest, rollout_id: str | None) -> dict[str, Any]:
        """Run a non-streaming request to the end and return the OpenAI response body."""
        started_at = time.time()
        prepared = await self._prepare_off_loop(request)
        for generation in prepared.generations:
            generation.stream_tokens = False
            generation.session = rollout_id
        events = _Events([self.chat.engine.submit(g) for g in prepared.generations], request.n)
        finished: Finished = {}
        try:
            while len(finished) < events.choices:
                number, event = await events.next()
                if isinstance(event, FinishEvent):
                    finished[number, event.choice_index] = event
        except asyncio.CancelledError:
            for generation in prepared.generations:
                generation.cancel()
            raise
        finally:
            events.close()
        raise_if_failed(finished.values())
        answered = _Answered(_new_id(), int(time.time()), request, prepared, finished)
        body = self._body(answered)
        await self.chat._off_loop(request, self._record, answered, rollout_id, started_at)
        return body

    def _body(self, answered: _Answered) -> dict[str, Any]:
        completion_id, request, prepared = (
            answered.completion_id,
            answered.request,
            answered.prepared,
        )
        finished = answered.finished
        choices = []
        for index, number, event, own_prompt in _choice_events(request, prepared, finished):
            logprobs = None
            if request.logprobs is not None:
                logprobs = self._logprobs(event.token_ids, event.logprobs, event.top_logprobs)
            choices.append(
                {
                    "index": index,
                    "text": prepared.echoed[number] + event.text,
                    "logprobs": logprobs,
                    "finish_reason": event.finish_reason,
                    "token_ids": event.token_ids,
                    # Names the record: a CompletionChoice alone identifies a trainable turn.
                    "completion_id": completion_id,
                    **own_prompt,
                }
            )
        return {
            "id": completion_id,
            "object": "text_completion",
            "created": answered.created,
            "model": _answering_model(request, prepared),
            "choices": choices,
            "usage": _usage(prepared, finished),
            "system_fingerprint": None,
            "prompt_token_ids": prepared.generations[0].prompt_ids,
        }

    def _logprobs(
        self,
        token_ids: list[int],
        logprobs: list[float],
        top_logprobs: list[list[tuple[int, float]]],
        offset: int = 0,
    ) -> dict[str, Any]:
        """OpenAI's legacy shape: per token its text, logprob, the top ones (the sampled token
        always among them, so up to `logprobs` + 1) and where it starts in the choice's text."""
        decode = self.chat.engine.tokenizer.decode
        tokens = [decode([token]) for token in token_ids]
        offsets = []
        for text in tokens:
            offsets.append(offset)
            offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": list(logprobs),
            "top_logprobs": [
                {**{decode([other]): value for other, value in top}, text: logprob}
                for text, logprob, top in zip(tokens, logprobs, top_logprobs, strict=True)
            ],
            "text_offset": offsets,
        }

    async def stream(
        self, request: CompletionRequest, rollout_id: str | None
    ) -> AsyncIterator[str]:
        """Prepare eagerly (so bad input fails before streaming), then yield SSE lines."""
        prepared = await self._prepare_off_loop(request)
        for generation in prepared.generations:
            generation.session = rollout_id
        events = _Events([self.chat.engine.submit(g) for g in prepared.generations], request.n)
        return self._stream_events(request, rollout_id, prepared, events)

    async def _stream_events(
        self,
        request: CompletionRequest,
        rollout_id: str | None,
        prepared: PreparedCompletion,
        events: _Events,
    ) -> AsyncIterator[str]:
        completion_id, started_at = _new_id(), time.time()
        created, n = int(started_at), request.n
        model = _answering_model(request, prepared)

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            body = {
                "id": completion_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": choices,
                **extra,
            }
            return f"data: {sse_json(body)}\n\n"

        finished: Finished = {}
        streamed: dict[tuple[int, int], str] = {}  # text sent per choice (the echo apart)
        offsets: dict[tuple[int, int], int] = {}  # where the next token starts in its text
        try:
            if request.echo:
                yield chunk(
                    [
                        _chunk_choice(number * n + choice, prepared.echoed[number])
                        for number in range(len(prepared.generations))
                        for choice in range(n)
                    ]
                )
            while len(finished) < events.choices:
                number, event = await events.next()
                key, index = (number, event.choice_index), number * n + event.choice_index
                if isinstance(event, TokenEvent):
                    streamed[key] = streamed.get(key, "") + event.text_delta
                    choice = _chunk_choice(index, event.text_delta, token_ids=[event.token_id])
                    if request.logprobs is not None:
                        logprobs = self._logprobs(
                            [event.token_id],
                            [event.logprob],
                            [event.top_logprobs],
                            offsets.get(key, 0),
                        )
                        offsets[key] = offsets.get(key, 0) + len(logprobs["tokens"][0])
                        choice["logprobs"] = logprobs
                    yield chunk([choice])
                    continue
                finished[key] = event
                if event.finish_reason in ("error", "cancelled"):
                    yield sse_error(event.error or "the request was cancelled")
                    continue
                sent = streamed.get(key, "")
                # The text an engine released only with the finish (a held-back stop prefix).
                rest = event.text[len(sent) :] if event.text.startswith(sent) else ""
                yield chunk([_chunk_choice(index, rest, finish_reason=event.finish_reason)])
            if all(
                event.finish_reason not in ("error", "cancelled") for event in finished.values()
            ):
                # Recorded before [DONE], so a client that reads the rollout next finds it.
                answered = _Answered(completion_id, created, request, prepared, finished)
                await self.chat._off_loop(request, self._record, answered, rollout_id, started_at)
            if request.stream_options and request.stream_options.include_usage:
                yield chunk([], usage=_usage(prepared, finished))
            yield "data: [DONE]\n\n"
        finally:
            if len(finished) < events.choices:  # the client went away
                for generation in prepared.generations:
                    generation.cancel()
            events.close()

    # ---------------------------------------------------------------------------------- records

    def _record(self, answered: _Answered, rollout_id: str | None, started_at: float) -> None:
        request, prepared, finished = answered.request, answered.prepared, answered.finished
        choices = [
            {
                "index": index,
                "text": event.text,
                "finish_reason": event.finish_reason,
                "token_ids": event.token_ids,
                "logprobs": event.logprobs,
                **own_prompt,
            }
            for index, _, event, own_prompt in _choice_events(request, prepared, finished)
        ]
        self.chat.records.add(
            {
                "id": answered.completion_id,
                "object": "text_completion",
                "started_at": started_at,
                "recorded_at": time.time(),
                "created": answered.created,
                "rollout_id": rollout_id,
                "model": _answering_model(request, prepared),
                "request": request.model_dump(exclude_none=True),
                "prompt_token_ids": prepared.generations[0].prompt_ids,
                "choices": choices,
                "usage": _usage(prepared, finished),
            }
        )


def _choice_events(
    request: CompletionRequest, prepared: PreparedCompletion, finished: Finished
) -> Iterator[tuple[int, int, FinishEvent, dict[str, Any]]]:
    """Each choice's index, prompt number and finish event, in index order (prompt p's choice
    j is p * n + j), and its own `prompt_token_ids` when the request had several prompts."""
    several = len(prepared.generations) > 1
    for number, generation in enumerate(prepared.generations):
        own_prompt = {"prompt_token_ids": generation.prompt_ids} if several else {}
        for choice in range(request.n):
            yield number * request.n + choice, number, finished[number, choice], own_prompt


class _Events:
    """The events of one engine request per prompt, as (prompt number, event), as they come."""

    def __init__(self, queues: list[asyncio.Queue], n: int) -> None:
        self.choices = len(queues) * n
        self._queues = queues
        self._merged: asyncio.Queue = asyncio.Queue()
        self._forwarding = []
        if len(queues) > 1:
            self._forwarding = [
                asyncio.ensure_future(self._forward(number, queue, n))
                for number, queue in enumerate(queues)
            ]

    async def next(self) -> tuple[int, TokenEvent | FinishEvent]:
        """The next event of any prompt's request."""
        if len(self._queues) == 1:
            return 0, await self._queues[0].get()
        return await self._merged.get()

    async def _forward(self, number: int, queue: asyncio.Queue, n: int) -> None:
        finishes = 0
        while finishes < n:
            event = await queue.get()
            self._merged.put_nowait((number, event))
            finishes += isinstance(event, FinishEvent)

    def close(self) -> None:
        """Stop forwarding (the request is done, failed or cancelled)."""
        for task in self._forwarding:
            task.cancel()


def _chunk_choice(
    index: int, text: str, *, finish_reason: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason, **extra}


def _answering_model(request: CompletionRequest, prepared: PreparedCompletion) -> str:
    """The served step that answered (`agent@3`, also when the request named `agent`)."""
    adapter = prepared.generations[0].adapter
    return adapter if adapter is not None else request.model


def _usage(prepared: PreparedCompletion, finished: Finished) -> dict[str, int]:
    """Each prompt counted once (not once per choice), every sampled token counted."""
    prompt_tokens = sum(len(generation.prompt_ids) for generation in prepared.generations)
    completion_tokens = sum(len(event.token_ids) for event in finished.values())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _new_id() -> str:
    return "cmpl-" + secrets.token_hex(12)
