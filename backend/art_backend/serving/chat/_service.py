"""Chat completions: an OpenAI request becomes prompt tokens, engine work, and an OpenAI response.

Beside OpenAI's fields every response carries `prompt_token_ids` and, per choice, `token_ids`
(vLLM's names) and `completion_id`, and every completion is recorded server-side with its exact tokens and logprobs.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from art_backend._errors import (
    BackendError,
    ContextLengthError,
    EngineStoppedError,
    ModelNotServedError,
)
from art_backend.engines._aliases import alias_pins
from art_backend.engines._chat_templates import template_refusal
from art_backend.engines._constrained import Grammar
from art_backend.engines._engine import (
    Engine,
    FinishEvent,
    GenerationRequest,
    TokenEvent,
)
from art_backend.engines._tool_calls import (
    parse_tool_calls,
    prepare_messages,
    template_supports_tools,
)
from art_backend.serving._request import BodySized
from art_backend.serving._sampling_params import sampling_params
from art_backend.serving._sse import sse_error, sse_json
from art_backend.serving.chat._grammars import GrammarBuild, GrammarLane, grammar_build
from art_backend.serving.chat._schemas import ChatCompletionRequest
from art_backend.store._records import CompletionRecords, json_nodes
from art_core.names import ADAPTER_NAME_PATTERN

_Result = TypeVar("_Result")
# Bodies over this are prepared and recorded in a lane of their own (see ChatService).
LARGE_BODY_BYTES = 1024 * 1024


class ChatService:
    """Serves chat completions for one engine: the base model and its adapters."""

    def __init__(
        self,
        engine: Engine,
        *,
        base_names: list[str],
        records: CompletionRecords,
        grammar_compiler: Any,
    ) -> None:
        self.engine = engine
        self.base_names = base_names
        self.records = records
        self.grammar_compiler = grammar_compiler
        self.supports_tools = template_supports_tools(engine.tokenizer.chat_template)
        # No token is longer than this, so a prompt of more characters than context x this
        # cannot fit, whatever it tokenizes to: refused before the template and tokenizer run.
        self.longest_token_chars = max(map(len, engine.tokenizer.get_vocab()), default=1)
        # Tokenizing and storing records (a dump and a size estimate, as long as the request)
        # run here, off the event loop; the tokenizer releases the GIL for its heavy part. A few
        # threads: the engine needs the cores more. Grammars compile in their own lane.
        self._workers = ThreadPoolExecutor(
            max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="art-prepare"
        )
        # Requests that came in bodies over LARGE_BODY_BYTES take a lane of their own: two of
        # them (a 9 MB tool list) once held both threads while a small chat waited 56 s.
        self._large_workers = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="art-prepare-large"
        )
        self.grammars = GrammarLane()
        self.preparing = 0  # requests being tokenized or compiled now (art_requests_preparing)
        self.stalled_streams = 0  # dropped: their reader stopped reading (`serving._answer`)

    # ------------------------------------------------------------------------------- model names

    def served_models(self) -> list[str]:
        """The names a request may use as `model`: the base first, then per trained model its
        plain name (an alias of its promoted step) and its `name@step` adapters by step."""
        adapters = list(self.engine.adapters)  # one snapshot: the trainer thread adds steps
        names = {*adapters, *self._plain_names(adapters)}
        return [self.base_names[0], *sorted(names, key=_served_order)]

    def resolve_adapter(self, model: str) -> str | None:
        """None for the base model, the served adapter name otherwise; 404 if unknown.

        A trained model's plain name (`agent`, what ART's tutorials send as `model=model.name`)
        means its promoted step, by default its latest served one (`engines._aliases`); `agent@3` pins
        one step. The caller records the resolved name, so training and staleness checks see
        the step that actually answered.
        """
        if model in self.base_names:
            return None
        adapters = list(self.engine.adapters)
        if model in adapters:
            return model
        if (step := self._plain_names(adapters).get(model)) is not None:
            return step
        raise ModelNotServedError(
            f"The model {model!r} does not exist on this server. "
            f"Served models: {', '.join(self.served_models())}."
        )

    def _plain_names(self, adapters: list[str]) -> dict[str, str]:
        """Each trained model's plain name -> the served step it answers from: the pinned one
        when it is loaded, else the highest."""
        names = _latest_steps(adapters)
        for name, pinned in list(alias_pins(self.engine).items()):
            if name in names and pinned in adapters:
                names[name] = pinned
        return names

    # ---------------------------------------------------------------------------------- requests

    def prepare(
        self, request: ChatCompletionRequest
    ) -> tuple[GenerationRequest, bool, GrammarBuild | None]:
        """Validate against the model and build the engine request; returns it, whether tool
        calls are parsed, and the compile of its grammar still to run (in `self.grammars`)."""
        adapter = self.resolve_adapter(request.model)
        tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
        tool_choice = request.tool_choice or ("auto" if tools else "none")
        use_tools = bool(tools) and tool_choice != "none"
        self._check_prompt_characters(request, tools if use_tools else None)
        prompt_ids = self._prompt_ids(request, tools if use_tools else None)

        context = self.engine.context_length
        max_new_tokens = request.requested_max_tokens
        if max_new_tokens is None:
            max_new_tokens = context - len(prompt_ids)
            if max_new_tokens < 1:
                raise ContextLengthError(
                    f"The prompt has {len(prompt_ids)} tokens, which fills the model's context "
                    f"of {context} tokens. Shorten the messages.",
                    param="messages",
                )
        elif len(prompt_ids) + max_new_tokens > context:
            field = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
            raise ContextLengthError(
                f"This model's maximum context length is {context} tokens. The prompt has "
                f"{len(prompt_ids)} tokens and {field} is {max_new_tokens}, "
                f"{len(prompt_ids) + max_new_tokens} in all. Lower {field} or shorten the messages.",
                param=field,
            )

        build_grammar = grammar_build(self.grammar_compiler, request, tools, tool_choice)
        params = sampling_params(
            request,
            self.engine.vocab_size,
            max_new_tokens=max_new_tokens,
            top_logprobs=request.top_logprobs or 0,
        )
        generation = GenerationRequest(
            prompt_ids=prompt_ids, params=params, n=request.n, adapter=adapter
        )
        return generation, use_tools, build_grammar

    def _check_prompt_characters(
        self, request: ChatCompletionRequest, tools: list[dict] | None
    ) -> None:
        context = self.engine.context_length
        limit = context * self.longest_token_chars
        message_chars = sum(_message_characters(message) for message in request.messages)
        tool_chars = _text_characters(tools) if tools else 0
        if message_chars + tool_chars <= limit:
            return
        param = "messages" if message_chars > limit else "tools"
        raise ContextLengthError(
            f"The {'messages and tools' if tool_chars else 'messages'} hold "
            f"{message_chars + tool_chars:,} characters, more than this model's context of "
            f"{context} tokens can hold: no token is longer than {self.longest_token_chars} "
            f"characters, so at most {limit:,} fit. Shorten the {param}.",
            param=param,
        )

    def _prompt_ids(self, request: ChatCompletionRequest, tools: list[dict] | None) -> list[int]:
        messages = [message.model_dump(exclude_none=True) for message in request.messages]
        prepared = prepare_messages(messages, tools, supports_tools=self.supports_tools)
        tokenizer = self.engine.tokenizer
        try:
            text = tokenizer.apply_chat_template(
                prepared,
                tools=tools if self.supports_tools else None,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as error:  # jinja raises on conversations the template forbids
            raise template_refusal(tokenizer, error) from error  # or on no template at all
        return tokenizer.encode(text, add_special_tokens=False)

    # --------------------------------------------------------------------------------- responses

    async def complete(
        self, request: ChatCompletionRequest, rollout_id: str | None
    ) -> dict[str, Any]:
        """Run a non-streaming request to the end and return the OpenAI response body."""
        started_at = time.time()
        generation, use_tools = await self._prepare_off_loop(request)
        generation.stream_tokens = False
        generation.session = rollout_id
        events = self.engine.submit(generation)
        finished: dict[int, FinishEvent] = {}
        try:
            while len(finished) < generation.n:
                event = await events.get()
                if isinstance(event, FinishEvent):
                    finished[event.choice_index] = event
        except asyncio.CancelledError:
            generation.cancel()
            raise
        raise_if_failed(finished.values())
        body = self._completion_body(
            _new_id(), int(time.time()), request, generation, finished, use_tools
        )
        await self._off_loop(request, self._record, body, request, rollout_id, started_at)
        return body

    def _completion_body(
        self,
        completion_id: str,
        created: int,
        request: ChatCompletionRequest,
        generation: GenerationRequest,
        finished: dict[int, FinishEvent],
        use_tools: bool,
    ) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": _answering_model(request, generation),
            # Each choice names its completion, so a `Choice` object alone identifies a trainable
            # turn (the training API looks its exact tokens up by this id).
            "choices": [
                {
                    **self._choice(finished[index], request, use_tools),
                    "completion_id": completion_id,
                }
                for index in range(generation.n)
            ],
            "usage": _usage(generation, finished.values()),
            "system_fingerprint": None,
            "prompt_token_ids": generation.prompt_ids,
        }

    async def stream(
        self, request: ChatCompletionRequest, rollout_id: str | None
    ) -> AsyncIterator[str]:
        """Prepare eagerly (so bad input fails before streaming), then yield SSE lines."""
        generation, use_tools = await self._prepare_off_loop(request)
        generation.session = rollout_id
        events = self.engine.submit(generation)
        return self._stream_events(request, rollout_id, generation, use_tools, events)

    async def _prepare_off_loop(
        self, request: ChatCompletionRequest
    ) -> tuple[GenerationRequest, bool]:
        # Submitting stays on the loop, after this returns: a request cancelled while it is
        # prepared never reaches the engine (the thread finishes, its result is dropped).
        self.preparing += 1
        try:
            generation, use_tools, build_grammar = await self._off_loop(
                request, self.prepare, request
            )
            if build_grammar is not None:
                self.constrain(generation, await self.grammars.compile(build_grammar))
            return generation, use_tools
        finally:
            self.preparing -= 1

    def constrain(self, generation: GenerationRequest, grammar: Grammar | None) -> None:
        """Attach a compiled grammar: its text for vLLM, a copy of its matcher per choice."""
        if grammar is None:
            return
        compiler = self.grammar_compiler
        generation.params.grammar = grammar.text
        generation.constraint_factory = lambda: compiler.matcher(grammar)

    async def _off_loop(
        self, request: BodySized, work: Callable[..., _Result], *args: Any
    ) -> _Result:
        """Run `work` on a worker thread: the large lane when `request` came in a large body."""
        large = request.body_bytes > LARGE_BODY_BYTES
        workers = self._large_workers if large else self._workers
        return await asyncio.get_running_loop().run_in_executor(workers, work, *args)

    async def _stream_events(
        self,
        request: ChatCompletionRequest,
        rollout_id: str | None,
        generation: GenerationRequest,
        use_tools: bool,
        events: asyncio.Queue,
    ) -> AsyncIterator[str]:
        completion_id, started_at = _new_id(), time.time()
        created = int(started_at)
        answering_model = _answering_model(request, generation)

        def chunk(choices: list[dict], **extra: Any) -> str:
            body = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": answering_model,
                "system_fingerprint": None,
                "choices": choices,
                **extra,
            }
            return f"data: {sse_json(body)}\n\n"

        finished: dict[int, FinishEvent] = {}
        streamed = dict.fromkeys(range(generation.n), "")
        try:
            first = [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                for i in range(generation.n)
            ]
            yield chunk(first, prompt_token_ids=generation.prompt_ids)
            while len(finished) < generation.n:
                event = await events.get()
                if isinstance(event, TokenEvent):
                    yield chunk([self._token_choice(event, request, use_tools, streamed)])
                    continue
                finished[event.choice_index] = event
                if event.finish_reason in ("error", "cancelled"):
                    yield sse_error(event.error or "the request was cancelled")
                    continue
                message = self._message(event, use_tools, request)
                delta = _final_delta(event, message, use_tools, streamed[event.choice_index])
                reason = _finish_reason(event, message)
                yield chunk(
                    [{"index": event.choice_index, "delta": delta, "finish_reason": reason}]
                )
            if all(
                event.finish_reason not in ("error", "cancelled") for event in finished.values()
            ):
                # Recorded before [DONE], so a client that reads the rollout next finds it.
                body = self._completion_body(
                    completion_id, created, request, generation, finished, use_tools
                )
                await self._off_loop(request, self._record, body, request, rollout_id, started_at)
            if request.stream_options and request.stream_options.include_usage:
                yield chunk([], usage=_usage(generation, finished.values()))
            yield "data: [DONE]\n\n"
        finally:
            if len(finished) < generation.n:
                generation.cancel()  # the client went away

    def _token_choice(
        self,
        event: TokenEvent,
        request: ChatCompletionRequest,
        use_tools: bool,
        streamed: dict[int, str],
    ) -> dict[str, Any]:
        """One sampled token as a chunk's choice (its text unless tool calls are parsed at the
        end); `streamed` keeps the text sent so far per choice."""
        delta: dict[str, Any] = {}
        if event.text_delta and not use_tools:  # tool output is parsed at the end
            delta["content"] = event.text_delta
            streamed[event.choice_index] += event.text_delta
        choice: dict[str, Any] = {
            "index": event.choice_index,
            "delta": delta,
            "finish_reason": None,
            "token_ids": [event.token_id],
        }
        if request.logprobs:
            entry = self._logprob_entry(event.token_id, event.logprob, event.top_logprobs)
            choice["logprobs"] = {"content": [entry]}
        return choice

    def _message(
        self, event: FinishEvent, use_tools: bool, request: ChatCompletionRequest
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": event.text}
        if use_tools:
            names = {tool.function.name for tool in request.tools or []}
            # A call the token limit cut is dropped, never returned as markup text.
            cut = event.finish_reason == "length"
            content, tool_calls = parse_tool_calls(event.text, names, cut=cut)
            if tool_calls and not request.parallel_tool_calls:
                tool_calls = tool_calls[:1]
            message["content"] = content
            if tool_calls:
                message["tool_calls"] = tool_calls
        return message

    def _choice(
        self, event: FinishEvent, request: ChatCompletionRequest, use_tools: bool
    ) -> dict[str, Any]:
        message = self._message(event, use_tools, request)
        logprobs = None
        if request.logprobs:
            logprobs = {
                "content": [
                    self._logprob_entry(token, logprob, top)
                    for token, logprob, top in zip(
                        event.token_ids, event.logprobs, event.top_logprobs, strict=True
                    )
                ]
            }
        return {
            "index": event.choice_index,
            "message": message,
            "finish_reason": _finish_reason(event, message),
            "logprobs": logprobs,
            "token_ids": event.token_ids,
            "sampled_logprobs": event.logprobs,
        }

    def _logprob_entry(
        self, token_id: int, logprob: float, top: list[tuple[int, float]]
    ) -> dict[str, Any]:
        def entry(token: int, value: float) -> dict[str, Any]:
            text = self.engine.tokenizer.decode([token])
            return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

        return {**entry(token_id, logprob), "top_logprobs": [entry(t, v) for t, v in top]}

    def _record(
        self,
        body: dict[str, Any],
        request: ChatCompletionRequest,
        rollout_id: str | None,
        started_at: float,
    ) -> None:
        self.records.add(
            {
                "id": body["id"],
                # When the request arrived and when its answer was complete: the call's latency.
                "started_at": started_at,
                "recorded_at": time.time(),
                "created": body["created"],
                "rollout_id": rollout_id,
                # The step that answered (`agent@3`), also when the request named `agent`.
                "model": body["model"],
                "request": request.model_dump(exclude_none=True),
                "prompt_token_ids": body["prompt_token_ids"],
                "choices": [
                    {
                        "index": choice["index"],
                        "message": choice["message"],
                        "finish_reason": choice["finish_reason"],
                        "token_ids": choice["token_ids"],
                        "logprobs": choice["sampled_logprobs"],
                    }
                    for choice in body["choices"]
                ],
                "usage": body["usage"],
            }
        )


def _answering_model(request: ChatCompletionRequest, generation: GenerationRequest) -> str:
    """The `model` of a response: the served step that answered, as OpenAI names the dated
    model behind an alias; a base-model request keeps the name it used."""
    return generation.adapter if generation.adapter is not None else request.model


def _latest_steps(adapters: list[str]) -> dict[str, str]:
    """Each trained model's plain name -> the served name of its highest step."""
    latest: dict[str, tuple[int, str]] = {}
    for served in adapters:
        if (match := ADAPTER_NAME_PATTERN.fullmatch(served)) is None:
            continue
        name, step = match[1], int(match[2])
        if name not in latest or step > latest[name][0]:
            latest[name] = (step, served)
    return {name: served for name, (_, served) in latest.items()}


def _served_order(served: str) -> tuple[str, int]:
    """A model's plain name first, then its steps in numeric order (`a@9` before `a@10`)."""
    if (match := ADAPTER_NAME_PATTERN.fullmatch(served)) is None:
        return served, -1
    return match[1], int(match[2])


def _message_characters(message: Any) -> int:
    """Characters of a message that any chat template renders: its text, name and tool calls."""
    content = message.content
    if isinstance(content, list):
        content = [part.get("text") for part in content]
    calls = [(call.function.name, call.function.arguments) for call in message.tool_calls or []]
    return _text_characters([content, message.name, calls])


def _text_characters(value: Any) -> int:
    """Characters in the strings of a JSON-like value: its string values and its keys (a
    template renders a tool schema's property names too: 9 MB of them once passed uncounted)."""
    return sum(len(node) for node in json_nodes(value) if isinstance(node, str))


def _final_delta(
    event: FinishEvent, message: dict[str, Any], use_tools: bool, sent: str
) -> dict[str, Any]:
    """The last chunk's delta of a choice: parsed content and tool calls, or the text an engine
    released only with the finish (vLLM may) beyond what was `sent`."""
    delta: dict[str, Any] = {}
    if use_tools and message.get("content"):
        delta["content"] = message["content"]
    elif not use_tools and event.text.startswith(sent) and len(event.text) > len(sent):
        delta["content"] = event.text[len(sent) :]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    return delta


def _finish_reason(event: FinishEvent, message: dict[str, Any]) -> str:
    if message.get("tool_calls") and event.finish_reason == "stop":
        return "tool_calls"
    return event.finish_reason


def _usage(generation: GenerationRequest, finished: Any) -> dict[str, int]:
    completion_tokens = sum(len(event.token_ids) for event in finished)
    prompt_tokens = len(generation.prompt_ids)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def raise_if_failed(finished: Any) -> None:
    """Raise the error of the first finish event that failed (Completions uses it too)."""
    for event in finished:
        if event.unavailable:  # not a bug of ours: the replica went away; a retry is served
            raise EngineStoppedError(f"Generation failed: {event.error}")
        if event.finish_reason in ("error", "cancelled"):
            raise BackendError(f"Generation failed: {event.error or event.finish_reason}")


def _new_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)
