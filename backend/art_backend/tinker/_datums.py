"""A forward_backward's datums, checked, then translated onto the trainer's one row type.

A Tinker datum is n input tokens x and n targets y (y[t] is what position t predicts) with its
loss inputs per token. The trainer's rows (`training._rows.Rows`) score the label at column p
from the logits of column p - 1, so a datum becomes the row

    input_ids   x[0] ... x[n-1] y[n-1]        (n + 1 tokens: the last one's logits are unused)
    target_ids  0    y[0] ...    y[n-1]
    scored      no   yes  ...    yes          (`trained_mask`; each loss input aligned the same)

and the datums of one request are grouped by their shared prefixes (`_packing.prefix_groups`),
which the packer carries through the model once. Every check names the datum and what to send
instead; a value that is not finite never reaches a loss.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from art_backend._errors import InvalidRequestError
from art_backend.tinker._proto import ForwardBackwardWire, WireDatum
from art_backend.training._losses import TinkerLoss
from art_backend.training._packing import prefix_groups
from art_backend.training._rows import Rows


def datum_rows(
    wire: ForwardBackwardWire, loss: TinkerLoss, *, vocabulary: int, context: int
) -> Rows:
    """The request's datums as rows, in request order (a row's `trajectory_ids` entry is its
    datum's index); a 400 naming the first datum that cannot be trained as sent."""
    if not wire.data:
        raise InvalidRequestError("forward_backward needs at least one datum.", param="data")
    for number, datum in enumerate(wire.data):
        check_datum(f"data[{number}]", datum, loss, wire.loss_fn, vocabulary, context)
    lengths = [len(datum.tokens) for datum in wire.data]
    shape = (len(wire.data), max(lengths) + 1)
    input_ids = torch.zeros(shape, dtype=torch.long)
    target_ids = torch.zeros(shape, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    trained_mask = torch.zeros(shape, dtype=torch.bool)
    names = sorted(set(wire.data[0].inputs) - {"target_tokens"})
    token_inputs = {name: torch.zeros(shape, dtype=torch.float32) for name in names}
    sequences = []
    for row, (datum, n) in enumerate(zip(wire.data, lengths, strict=True)):
        targets = torch.from_numpy(datum.inputs["target_tokens"].values.astype(np.int64))
        input_ids[row, :n] = torch.tensor(datum.tokens, dtype=torch.long)
        input_ids[row, n] = targets[-1]
        target_ids[row, 1 : n + 1] = targets
        attention_mask[row, : n + 1] = 1
        trained_mask[row, 1 : n + 1] = True
        for name in names:
            values = datum.inputs[name].values.astype(np.float32)
            token_inputs[name][row, 1 : n + 1] = torch.from_numpy(values)
        sequences.append(input_ids[row, : n + 1].tolist())
    return Rows(
        input_ids=input_ids,
        attention_mask=attention_mask,
        trained_mask=trained_mask,
        old_logprobs=torch.zeros(shape, dtype=torch.float32),
        advantages=torch.zeros(len(wire.data), dtype=torch.float32),
        group_ids=torch.tensor(prefix_groups(sequences), dtype=torch.long),
        trajectory_ids=[str(number) for number in range(len(wire.data))],
        target_ids=target_ids,
        token_inputs=token_inputs,
    )


def check_datum(
    where: str, datum: WireDatum, loss: TinkerLoss, loss_name: str, vocabulary: int, context: int
) -> None:
    """A 400 naming what in datum `where` the loss cannot train on."""
    if datum.other_chunks:
        raise InvalidRequestError(
            f"{where}: {sorted(set(datum.other_chunks))} chunks are not served; this "
            "server trains on encoded_text chunks.",
            param="data",
        )
    missing = [name for name in loss.required if name not in datum.inputs]
    extra = sorted(set(datum.inputs) - {*loss.required, *loss.optional})
    if missing or extra:
        raise InvalidRequestError(
            f"{where}: {loss_name} reads loss_fn_inputs {list(loss.required)} "
            f"(optional {list(loss.optional)}); missing {missing}, not read {extra}.",
            param="data",
        )
    tokens = datum.tokens
    if not tokens:
        raise InvalidRequestError(f"{where} has no input tokens.", param="data")
    if len(tokens) > context:
        raise InvalidRequestError(
            f"{where} has {len(tokens)} tokens; the model's context is {context}.",
            param="data",
        )
    for name, tensor in datum.inputs.items():
        if tensor.values.shape != (len(tokens),):
            raise InvalidRequestError(
                f"{where}: loss_fn_inputs[{name!r}] has shape {list(tensor.values.shape)}; it "
                f"needs one value per input token ([{len(tokens)}]).",
                param="data",
            )
        check_finite(f"{where}: loss_fn_inputs[{name!r}]", tensor.values)
    check_vocabulary(f"{where}: model_input", np.asarray(tokens), vocabulary)
    check_vocabulary(f"{where}: target_tokens", datum.inputs["target_tokens"].values, vocabulary)


def check_finite(where: str, values: np.ndarray) -> None:
    """A 400 naming the first value that is NaN or infinite: it would make the loss, then the
    gradient and every later step of the run, NaN (or a loss of 0 that trains nothing)."""
    if values.dtype.kind != "f":
        return
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        value = float(values[bad[0]])
        raise InvalidRequestError(
            f"{where} holds {value} at position {int(bad[0])} ({bad.size} value(s) not finite). "
            "Send finite numbers: a NaN or infinite weight, advantage or logprob makes the loss "
            "and the gradient NaN.",
            param="data",
        )


def check_vocabulary(
    where: str, tokens: np.ndarray | list[int], vocabulary: int, param: str = "data"
) -> None:
    """A 400 naming the token ids outside [0, vocabulary), if any (a float id must be whole)."""
    values = np.asarray(tokens)
    if values.size == 0:
        return
    whole = values if values.dtype.kind in "iu" else np.where(values % 1 == 0, values, -1)
    outside = np.unique(values[(whole < 0) | (whole >= vocabulary)])
    if outside.size:
        shown = [int(v) if float(v).is_integer() else float(v) for v in outside[:5]]
        raise InvalidRequestError(
            f"{where} holds token ids {shown} outside the vocabulary [0, {vocabulary}).",
            param=param,
        )


def finite_or_none(value: float) -> float | None:
    """`value`, or None when it is NaN or infinite (what a JSON answer cannot carry)."""
    return value if math.isfinite(value) else None
