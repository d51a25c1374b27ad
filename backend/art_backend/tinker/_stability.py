"""Samplers' stability records, and a training datum's provenance resolved against them.

A sampling client made with `record_stability_info=True` asks the server to keep, for each
sequence it samples, what training on that sequence later needs (Tinker's StableReinforce page:
https://tinker-docs.thinkingmachines.ai/tinker/losses/stable-reinforce). Here that is the prompt,
the sampled tokens and the logprob the engine answered for each: the sampler's own numerics,
which the trainer's forward need not reproduce. A sequence is named by the `sequence_id` the
sample answered, kept for a day after its last use (the page's rule: each training request that
uses a sequence restarts that day), the least recently used dropped first past
`MAX_RECORDED_TOKENS`.

A datum names its tokens' sequences with provenance (`Datum.with_provenance`: runs that tile
`model_input` and `target_tokens`, each `[offset, offset + length)` of a sequence's prompt or
sampled tokens). For a loss that reads it (`TinkerLoss.provenance`: `stable_reinforce`),
`resolve_provenance` checks every run against the record (within it; a sampled run's tokens are
the tokens sampled) and rewrites the datum's loss inputs:

    logprobs[t]    the recorded sampler logprob where target t is a sampled token, else 0
    advantages[t]  as sent where target t is a sampled token, else 0 (prompt tokens: no update)

Each refusal is a 400 naming the datum and the run.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from art_backend._errors import InvalidRequestError
from art_backend.tinker._proto_decode import ForwardBackwardWire, WireDatum, WireSpan, WireTensor

RECORD_SECONDS = 24 * 3600  # Tinker's: trainable for one day after sampling (or last use)
# What the records hold at most: 16M tokens at 12 bytes each (prompt and sampled token ids,
# float32 logprobs) is about 200 MB; an RL step of the cookbook's records well under 1M.
MAX_RECORDED_TOKENS = 2**24


@dataclass
class RecordedSequence:
    """What a sampler recorded of one sampled sequence."""

    prompt: np.ndarray  # int64 token ids
    tokens: np.ndarray  # int64 sampled token ids
    logprobs: np.ndarray  # float32, the engine's, one per sampled token
    last_used: float

    @property
    def size(self) -> int:
        return len(self.prompt) + len(self.tokens)


class StabilityRecords:
    """The recorded sequences of this server's samplers, by sequence id."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        lifetime: float = RECORD_SECONDS,
        max_tokens: int = MAX_RECORDED_TOKENS,
    ) -> None:
        self.clock, self.lifetime, self.max_tokens = clock, lifetime, max_tokens
        self.sequences: OrderedDict[str, RecordedSequence] = OrderedDict()  # least recent first
        self.tokens = 0
        # Sampling records on the event loop; a large forward_backward resolves on a worker.
        self.lock = threading.Lock()

    def record(
        self, sequence_id: str, prompt: list[int], tokens: list[int], logprobs: list[float]
    ) -> None:
        """Keep one sampled sequence, dropping the least recently used past the bound."""
        recorded = RecordedSequence(
            np.asarray(prompt, dtype=np.int64),
            np.asarray(tokens, dtype=np.int64),
            np.asarray(logprobs, dtype=np.float32),
            self.clock(),
        )
        with self.lock:
            self.sequences[sequence_id] = recorded
            self.tokens += recorded.size
            self._forget()

    def use(self, sequence_id: str, where: str) -> RecordedSequence:
        """The sequence, its day restarted; a 400 when it was never recorded or has expired."""
        with self.lock:
            self._forget()
            recorded = self.sequences.get(sequence_id)
            if recorded is not None:
                recorded.last_used = self.clock()
                self.sequences.move_to_end(sequence_id)
        if recorded is None:
            raise InvalidRequestError(
                f"{where} names sequence {sequence_id!r}, which this server has no stability "
                "record of: sample with a sampling client made with record_stability_info=True "
                "(records last a day after their last use, and end with the server's process).",
                param="data",
            )
        return recorded

    def _forget(self) -> None:
        now = self.clock()
        while self.sequences:
            oldest_id, oldest = next(iter(self.sequences.items()))
            if self.tokens <= self.max_tokens and now - oldest.last_used < self.lifetime:
                return
            del self.sequences[oldest_id]
            self.tokens -= oldest.size


def resolve_provenance(wire: ForwardBackwardWire, records: StabilityRecords) -> None:
    """Check each datum's provenance against the records and rewrite its `logprobs` and
    `advantages` as the module's docstring says; a 400 naming the first datum that cannot."""
    for number, datum in enumerate(wire.data):
        where = f"data[{number}]"
        if datum.model_input_spans is None or datum.loss_fn_input_spans is None:
            raise InvalidRequestError(
                f"{where} carries no provenance; {wire.loss_fn} trains on sampled sequences "
                "named by their sequence_id: sample with record_stability_info=True, then "
                "datum.with_provenance(model_input=[...], loss_fn_inputs=[...]).",
                param="data",
            )
        targets = datum.inputs.get("target_tokens")
        if targets is None or "advantages" not in datum.inputs:
            return  # `check_datum` names what is missing
        claimed = np.asarray(datum.tokens, dtype=np.int64)
        _check_runs(f"{where}.model_input_spans", datum.model_input_spans, claimed, records)
        _resolve_targets(where, datum, targets.values.astype(np.int64), records)


def _resolve_targets(
    where: str, datum: WireDatum, targets: np.ndarray, records: StabilityRecords
) -> None:
    spans = datum.loss_fn_input_spans or []
    _check_runs(f"{where}.loss_fn_input_spans", spans, targets, records)
    logprobs = np.zeros(len(targets), dtype=np.float32)
    sampled = np.zeros(len(targets), dtype=bool)
    position = 0
    for span in spans:
        if span.sampled:
            recorded = records.use(span.sequence_id, where)
            end = position + span.length
            logprobs[position:end] = recorded.logprobs[span.offset : span.offset + span.length]
            sampled[position:end] = True
        position += span.length
    advantages = datum.inputs["advantages"].values
    if advantages.shape == sampled.shape:  # else `check_datum` names the shape
        datum.inputs["advantages"] = WireTensor(np.where(sampled, advantages, 0).astype(np.float32))
    datum.inputs["logprobs"] = WireTensor(logprobs)


def _check_runs(
    where: str, spans: list[WireSpan], claimed: np.ndarray, records: StabilityRecords
) -> None:
    """A 400 unless the runs tile `claimed`, each within its sequence's record, and each sampled
    run claims the tokens its sequence sampled."""
    covered = sum(span.length for span in spans)
    if covered != len(claimed):
        raise InvalidRequestError(
            f"{where} cover {covered} positions; the field they annotate has {len(claimed)}. "
            "Provenance runs tile it: every position in exactly one run.",
            param="data",
        )
    position = 0
    for index, span in enumerate(spans):
        recorded = records.use(span.sequence_id, f"{where}[{index}]")
        source = recorded.tokens if span.sampled else recorded.prompt
        part = "sampled tokens" if span.sampled else "prompt"
        stop = span.offset + span.length
        if stop > len(source):
            raise InvalidRequestError(
                f"{where}[{index}] claims positions [{span.offset}, {stop}) of sequence "
                f"{span.sequence_id!r}'s {part}, which has {len(source)}.",
                param="data",
            )
        # Only sampled runs are compared: the cookbook's rl_loop sends 0 for prompt targets.
        claim = claimed[position : position + span.length]
        if span.sampled and not np.array_equal(claim, source[span.offset : stop]):
            raise InvalidRequestError(
                f"{where}[{index}]: the tokens at positions [{position}, "
                f"{position + span.length}) are not sequence {span.sequence_id!r}'s {part} "
                f"[{span.offset}, {stop}) as sampled.",
                param="data",
            )
        position += span.length
