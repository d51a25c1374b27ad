"""The Tinker API's sampling: sampler weights are served steps, samples come from the engine.

`save_weights_for_sampler(name)` checkpoints the run as step N+1 (served `<model id>@<N+1>`,
like any step of ours) and names it `tinker://<model id>/sampler_weights/<name>`. A sampling
session points at such a path, or at the base model; `asample` completes the prompt's token ids
on the engine with that adapter and answers each sequence's tokens, their logprobs (always:
the engine computes them anyway) and why it stopped.

Served: num_samples, max_tokens, temperature, top_p, top_k, seed, stop strings, stop token
ids that are the model's own end tokens (the engine stops at those anyway), and the prompt's
logprobs and top k (`compute_logprobs`; `_prompt_logprobs`: the trainer's forward), and each
sampled token's top k (`topk_sample_logprobs`: the engine's, as the OpenAI routes' top_logprobs).
Refused by name: target prompt logprobs, alternative prompt tokens, other stop token ids, and
`stop=[]` (generation past the end tokens). With `record_stability_info` each sampled
sequence is recorded under its `sequence_id` for `stable_reinforce` (`_stability`).

A sample on sampler weights holds their step (the registry's adapter lease) while it generates:
neither the served window's trim nor a delete (`_checkpoints`) unloads an adapter in use.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from art_backend._errors import BackendError, ContextLengthError, InvalidRequestError, NotFoundError
from art_backend.engines._engine import FinishEvent, GenerationRequest, SamplingParams
from art_backend.tinker._datums import check_vocabulary
from art_backend.tinker._futures import Answer
from art_backend.tinker._prompt_logprobs import (
    MASK_LOGPROB,
    PromptLogprobs,
    PromptLogprobsAsked,
    check_scorable,
    prompt_logprobs_asked,
    score_prompt,
)
from art_backend.tinker._proto import WireSequence, encode_sample_response
from art_backend.tinker._run_index import check_ttl, expiry
from art_backend.tinker._schemas import (
    CreateSamplingSessionRequest,
    SampleRequest,
    SaveWeightsForSamplerRequest,
)
from art_backend.tinker._service import StepTally, TinkerTraining, TrainingRun
from art_core.names import check_name
from art_core.wire import HoldStepRequest

SAMPLER_PATH = "tinker://{model_id}/sampler_weights/{name}"


@dataclass(frozen=True)
class Sampler:
    """What a sampling session samples from: the base model or a run's served step."""

    base_model: str
    model_path: str | None
    adapter: str | None  # the engine's served name, `<model id>@<step>`; None: the base model
    run: TrainingRun | None = None
    step: int | None = None


class TinkerSampling:
    """Sampler weights, sampling sessions and samples, over one `TinkerTraining`."""

    def __init__(self, training: TinkerTraining):
        self.training = training
        self.engine = training.engine
        self.sessions: dict[str, Sampler] = {}

    # ----------------------------------------------------------------- save_weights_for_sampler

    def save_weights_for_sampler(self, request: SaveWeightsForSamplerRequest) -> str:
        """Checkpoint the run as its next step (in order) and name it, or open a session on it."""
        run = self.training.run(request.model_id)
        name = request.path
        if name is None and request.sampling_session_seq_id is None:
            raise InvalidRequestError("Give a sampler name (path).", param="path")
        if request.kind != "snapshot":
            raise InvalidRequestError(
                f"Sampling clients of kind {request.kind!r} are not served yet; this server "
                "saves snapshots (kind 'snapshot', the SDK's default).",
                param="kind",
            )
        if name is not None:
            try:
                check_name(name, "sampler name")
            except ValueError as error:
                raise InvalidRequestError(str(error), param="path") from error
        try:  # a TTL, as `_checkpoints` sets one later
            ttl = None if request.ttl_seconds is None else check_ttl(request.ttl_seconds)
        except ValueError as error:
            raise InvalidRequestError(f"{error}.", param="ttl_seconds") from None

        async def work() -> Answer:
            step = await self.training.training.save_step(
                run.registered,
                "tinker_sampler",
                {"tinker_sampler": name},
                run.since_checkpoint.metrics(),
            )
            run.since_checkpoint = StepTally()
            if name is None:  # save_weights_and_get_sampling_client: a session, unnamed
                session_id = self._open(self._sampler(run, step, None))
                return Answer(
                    {"sampling_session_id": session_id, "type": "save_weights_for_sampler"}
                )
            run.samplers[name] = step
            run.record.expires.pop(f"sampler_weights/{name}", None)  # a name saved again
            if ttl is not None:
                run.record.expires[f"sampler_weights/{name}"] = expiry(ttl)
            self.training.index.put(run.record)  # the path outlives this process
            path = SAMPLER_PATH.format(model_id=run.model_id, name=name)
            return Answer({"path": path, "type": "save_weights_for_sampler"})

        return self.training.in_order(run, request.seq_id, work)

    def _sampler(self, run: TrainingRun, step: int, path: str | None) -> Sampler:
        return Sampler(
            run.registered.base_model, path, run.registered.inference_name(step), run, step
        )

    # ----------------------------------------------------------------------- sampling sessions

    async def create_session(self, request: CreateSamplingSessionRequest) -> dict[str, Any]:
        """A sampling session on a sampler path, or on the base model."""
        sampler = await self.resolve(request.model_path, request.base_model)
        return {
            "sampling_session_id": self._open(sampler),
            "type": "create_sampling_session",
        }

    def _open(self, sampler: Sampler) -> str:
        session_id = f"sampler-{uuid.uuid4().hex[:16]}"
        self.sessions[session_id] = sampler
        return session_id

    def session(self, session_id: str) -> Sampler:
        """The sampling session `session_id` names (404 otherwise)."""
        sampler = self.sessions.get(session_id)
        if sampler is None:
            raise NotFoundError(f"No sampling session {session_id!r} on this server.")
        return sampler

    def describe(self, session_id: str) -> dict[str, Any]:
        """GET samplers/{id}: what the session samples from."""
        sampler = self.session(session_id)
        return {
            "sampler_id": session_id,
            "base_model": sampler.base_model,
            "model_path": sampler.model_path,
        }

    async def resolve(self, model_path: str | None, base_model: str | None) -> Sampler:
        """A `tinker://<model id>/sampler_weights/<name>` path (of a run of this process, or of
        one before a restart: `TinkerTraining.sampled_run`), else the base model."""
        if model_path is None:
            if base_model is None:
                raise InvalidRequestError("Give model_path or base_model.", param="model_path")
            self.training.check_base_model(base_model)
            return Sampler(base_model, None, None)
        parts = model_path.removeprefix("tinker://").split("/")
        if not model_path.startswith("tinker://") or len(parts) != 3:
            raise InvalidRequestError(
                f"model_path {model_path!r} is not a sampler path "
                "(tinker://<model id>/sampler_weights/<name>).",
                param="model_path",
            )
        if parts[1] != "sampler_weights":
            raise InvalidRequestError(
                f"model_path {model_path!r}: only sampler weights (sampler_weights/) are "
                "served for sampling yet; save them with save_weights_for_sampler.",
                param="model_path",
            )
        run = await self.training.sampled_run(parts[0])
        step = run.samplers.get(parts[2])
        if step is None:
            raise NotFoundError(
                f"Training run {parts[0]} has no sampler weights named {parts[2]!r} (it has "
                f"{sorted(run.samplers) or 'none'})."
            )
        return self._sampler(run, step, model_path)

    # --------------------------------------------------------------------------------- asample

    async def sample(self, request: SampleRequest) -> dict[str, Any]:
        """Check the request, then sample in a future; the future with one id per sample."""
        if request.sampling_session_id is not None:
            sampler = self.session(request.sampling_session_id)
            _check_not_deleted(sampler)
        else:
            sampler = await self.resolve(request.model_path, request.base_model)
        _refuse_unserved(request)
        prompt = self._prompt(request)
        asked = prompt_logprobs_asked(request, len(prompt))
        if asked.anything:
            check_scorable(self.engine)
        generation = GenerationRequest(
            prompt_ids=prompt,
            params=self._params(request, len(prompt)),
            n=request.num_samples,
            adapter=sampler.adapter,
            stream_tokens=False,
        )
        batch = f"seq-{uuid.uuid4().hex}"
        sequence_ids = [f"{batch}-{i}" for i in range(request.num_samples)]
        # record_stability_info: each sequence kept for training on it by id (`_stability`).
        recorded = sequence_ids if request.record_stability_info else None
        request_id = self.training.futures.start(
            self._generate(sampler, generation, asked, recorded)
        )
        return {"request_id": request_id, "sample_sequence_ids": sequence_ids}

    def _prompt(self, request: SampleRequest) -> list[int]:
        tokens: list[int] = []
        for chunk in request.prompt.chunks:
            if chunk.type != "encoded_text" or chunk.tokens is None:
                raise InvalidRequestError(
                    f"Prompt chunks of type {chunk.type!r} are not served; send encoded_text.",
                    param="prompt",
                )
            tokens += chunk.tokens
        check_vocabulary("The prompt", tokens, self.engine.vocab_size, param="prompt")
        if not tokens:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        return tokens

    def _params(self, request: SampleRequest, prompt_length: int) -> SamplingParams:
        params = request.sampling_params
        room = self.engine.context_length - prompt_length
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        if max_tokens > room or room < 1:
            raise ContextLengthError(
                f"The prompt's {prompt_length} tokens plus max_tokens {max_tokens} exceed the "
                f"model's context of {self.engine.context_length} tokens.",
                param="sampling_params.max_tokens",
            )
        return SamplingParams(
            max_new_tokens=max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=max(params.top_k, 0),
            stop=self._stop_strings(params.stop),
            seed=params.seed,
            top_logprobs=request.topk_sample_logprobs,
        )

    def _stop_strings(self, stop: str | list[str] | list[int] | None) -> list[str]:
        if stop is None:
            return []
        if isinstance(stop, str):
            return [stop]
        if not stop:
            raise InvalidRequestError(
                "stop=[] (generation past the model's end tokens) is not served yet.",
                param="sampling_params.stop",
            )
        if all(isinstance(item, str) for item in stop):
            return [str(item) for item in stop]
        ends = set(getattr(self.engine, "eos_token_ids", ()))
        others = sorted({int(item) for item in stop} - ends)
        if others:
            raise InvalidRequestError(
                f"Stop token ids {others} are not served yet; the engine stops at the model's "
                f"end tokens {sorted(ends)}. Give stop strings instead.",
                param="sampling_params.stop",
            )
        return []

    async def _generate(
        self,
        sampler: Sampler,
        generation: GenerationRequest,
        asked: PromptLogprobsAsked,
        recorded: list[str] | None,
    ) -> Answer:
        if sampler.run is None or sampler.step is None:  # the base model: nothing to hold
            return await self._generate_on_engine(sampler, generation, asked, recorded)
        # Deleted while this request waited for its turn: its adapter may be gone already.
        _check_not_deleted(sampler)
        # Held while it samples: the served window's trim and a delete leave its adapter loaded
        # (an adapter unloaded mid-generation failed the engine's whole batch). The hold also
        # serves an older step again.
        model, registry = sampler.run.registered, self.training.training.registry
        await registry.hold(model, HoldStepRequest(step=sampler.step))
        try:
            return await self._generate_on_engine(sampler, generation, asked, recorded)
        finally:
            # An older step stays loaded for the next sample, until the window's next trim.
            await registry.give_back(model, sampler.step, trim=False)

    async def _generate_on_engine(
        self,
        sampler: Sampler,
        generation: GenerationRequest,
        asked: PromptLogprobsAsked,
        recorded: list[str] | None,
    ) -> Answer:
        events = self.engine.submit(generation)
        scoring = (
            asyncio.create_task(
                asyncio.to_thread(
                    score_prompt, self.engine, sampler.adapter, generation.prompt_ids, asked
                )
            )
            if asked.anything
            else None
        )
        finished: dict[int, FinishEvent] = {}
        while len(finished) < generation.n:
            event = await events.get()
            if isinstance(event, FinishEvent):
                finished[event.choice_index] = event
        scored: PromptLogprobs | None = await scoring if scoring is not None else None
        sequences = []
        for index in range(generation.n):
            event = finished[index]
            if event.finish_reason not in ("stop", "length"):
                raise BackendError(f"Generation failed: {event.error or event.finish_reason}")
            top = (
                _top_matrices(event.top_logprobs, k)
                if (k := generation.params.top_logprobs)
                else None
            )
            sequences.append(
                WireSequence(event.finish_reason, event.token_ids, event.logprobs, top)
            )
            if recorded is not None:
                self.training.stability.record(
                    recorded[index], generation.prompt_ids, event.token_ids, event.logprobs
                )
        return Answer(proto=_sample_response(sequences, scored))


def _sample_response(sequences: list[WireSequence], scored: PromptLogprobs | None) -> bytes:
    if scored is None:
        return encode_sample_response(sequences)
    top = None
    if scored.top_ids is not None and scored.top_logprobs is not None:
        top = (scored.top_ids, scored.top_logprobs)
    return encode_sample_response(sequences, scored.logprobs, top)


def _top_matrices(rows: list[list[tuple[int, float]]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The engine's top logprobs of each sampled token as the SDK's TopkLogprobs matrices
    [length, k]: (ids, logprobs), sentinel slots (id 0, MASK_LOGPROB) where a row has fewer."""
    ids = np.zeros((len(rows), k), dtype=np.int32)
    logprobs = np.full((len(rows), k), MASK_LOGPROB, dtype=np.float32)
    for position, row in enumerate(rows):
        for rank, (token, logprob) in enumerate(row[:k]):
            ids[position, rank], logprobs[position, rank] = token, logprob
    return ids, logprobs


def _check_not_deleted(sampler: Sampler) -> None:
    """A session on sampler weights deleted since (`RestClient.delete_checkpoint`) is a 404."""
    if sampler.run is None or sampler.model_path is None:
        return
    name = sampler.model_path.rsplit("/", 1)[-1]
    if sampler.run.samplers.get(name) != sampler.step:
        raise NotFoundError(
            f"The sampler weights {sampler.model_path} were deleted (or saved again under that "
            "name) after this sampling client was created; create a sampling client on "
            "weights that exist."
        )


def _refuse_unserved(request: SampleRequest) -> None:
    """Sampling options this server does not serve yet, refused by their SDK names."""
    unserved = {
        "target_prompt_logprobs": request.target_prompt_logprobs is not None,
        "prompt_alt_tokens_k": request.prompt_alt_tokens_k > 0,
    }
    named = [name for name, asked in unserved.items() if asked]
    if named:
        raise InvalidRequestError(
            f"Sampling options {named} are not served by this server yet; it answers the "
            "sampled tokens with their logprobs.",
            param=named[0],
        )
