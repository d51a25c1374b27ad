"""Grammar-constrained decoding: `response_format` and `tool_choice` as token masks.

Each decode step, a constrained sequence may only sample tokens that keep its output a valid prefix
of the grammar. We compute that set with llguidance because:

- its core is Rust: the mask for a ~50k vocabulary takes tens of microseconds on CPU, cheaper than
  anything else in the step, so constraints cost almost nothing on CPU-only machines;
- it needs no torch (we bring the tensors) and no per-vocabulary precompilation per schema;
- it supports JSON Schema fully enough for OpenAI `json_schema` (refs, anyOf, enums, bounds,
  string lengths) and rejects what it cannot enforce instead of silently ignoring it;
- its Lark grammars can embed `%json {...}` schemas, which is exactly the shape of a tool call.

Flow: `GrammarCompiler` (one per tokenizer) turns a request into a `Grammar`, compiled and
validated up front, so bad input is a 400 before generation starts; `matcher()` gives each
sequence a `SequenceConstraint`, a copy of the grammar's compiled matcher (the engine thread never
compiles); the engine masks logits (`apply_constraints`), samples, and calls `advance`.
When the grammar is complete only the EOS tokens stay allowed, so the engine stops on its own.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llguidance
import llguidance.hf
import torch

from art_backend._errors import BackendError, InvalidGrammarError
from art_backend._limits import check_schema_sizes
from art_backend.engines._tool_calls import _TOOL_CALL_OPEN

# Whitespace in JSON is fixed to Python's json.dumps style: `{"a": 1, "b": [2, 3]}`. With
# flexible whitespace a weak model can emit spaces or newlines forever while staying "valid".
_JSON_LAYOUT: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}

# Terse errors: the verbose form embeds the whole grammar and parser state in the message.
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)
_CACHED_GRAMMARS = 64
# Every byte string: the complement of the empty string, plus it. A `/.../` regex cannot say
# this, as it refuses to match bytes that are not UTF-8 (a token may hold half a character),
# and llguidance writes special tokens as such bytes, so they are matched too.
_ANY_BYTES_LARK = 'ANY_BYTES: ~"" | ""\n'

logger = logging.getLogger("art_backend.engine")


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar: its text (what vLLM's guidance backend takes) and its validated
    matcher, which each constrained sequence starts from a copy of."""

    text: str
    compiled: llguidance.LLMatcher = field(compare=False, repr=False)


class GrammarCompiler:
    """Builds and validates grammars for one tokenizer; hands out per-sequence constraints."""

    def __init__(self, tokenizer: Any, eos_token_ids: list[int]):
        """Wrap an HF fast tokenizer (~1 s for a 50k vocabulary: build once per model)."""
        if not eos_token_ids:
            raise ValueError("GrammarCompiler needs at least one EOS token id")
        self.eos_token_ids = list(eos_token_ids)
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, eos_token=self.eos_token_ids)
        self.vocab_size: int = self._tokenizer.vocab_size
        # Validated matchers keyed by grammar text: a schema sent again is not compiled again.
        self._validated: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._unlexable: tuple[int, ...] | None = None

    def for_response_format(self, response_format: dict | None) -> Grammar | None:
        """Grammar for an OpenAI `response_format`, or None when output is free text.

        A `json_schema` is always enforced, whatever its `strict` flag says.
        """
        if response_format is None:
            return None
        kind = response_format.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            schema: Any = _ANY_JSON_OBJECT
        elif kind == "json_schema":
            json_schema = response_format.get("json_schema")
            if not isinstance(json_schema, dict):
                raise InvalidGrammarError(
                    'response_format of type "json_schema" needs a "json_schema" object '
                    'with a "name" and a "schema".',
                    param="response_format",
                )
            schema = json_schema.get("schema", _ANY_JSON_OBJECT)
            if not isinstance(schema, dict):
                raise InvalidGrammarError(
                    "response_format.json_schema.schema must be a JSON Schema object.",
                    param="response_format",
                )
        else:
            raise InvalidGrammarError(
                f"Unsupported response_format type {kind!r}; "
                'use "text", "json_object" or "json_schema".',
                param="response_format",
            )
        if kind == "json_schema":
            check_schema_sizes([("response_format.json_schema.schema", schema)])
        return self._compile(
            lambda: llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_LAYOUT),
            param="response_format",
        )

    def for_tool_choice(
        self, tools: list[dict], tool_choice: str | dict | None, parallel_tool_calls: bool
    ) -> Grammar | None:
        """Grammar for the tool calls of a request, or None when nothing needs enforcing.

        "required" or a named function: only `<tool_call>` blocks, arguments valid for the
        called function. "auto" with at least one `strict: true` function: free text, and once
        the model writes `<tool_call>`, calls whose arguments are valid for strict functions (any
        JSON object for the others), as OpenAI guarantees for strict functions whatever
        tool_choice is. "auto" without strict functions, "none" and None: no grammar, no cost.
        """
        if tool_choice in (None, "none"):
            return None
        functions = _function_definitions(tools)
        after_text = tool_choice == "auto"
        if after_text:
            strict = strict_function_names(tools)
            if not strict:
                return None
            repeat = parallel_tool_calls
            # Only strict schemas are enforced (and counted, and can make a 400); the other
            # functions still get well-formed calls with some JSON object as arguments.
            functions = {
                name: parameters if name in strict else _ANY_JSON_OBJECT
                for name, parameters in functions.items()
            }
            enforced = {name: functions[name] for name in strict}
        elif tool_choice == "required":
            if not functions:
                raise InvalidGrammarError(
                    'tool_choice "required" needs at least one function in tools.', param="tools"
                )
            repeat = parallel_tool_calls
        elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
            name = (tool_choice.get("function") or {}).get("name")
            if name not in functions:
                raise InvalidGrammarError(
                    f"tool_choice names function {name!r}, which is not in tools "
                    f"(available: {', '.join(functions) or 'none'}).",
                    param="tool_choice",
                )
            functions = {name: functions[name]}
            repeat = False
        else:
            raise InvalidGrammarError(
                f"Unsupported tool_choice {tool_choice!r}; use "
                '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}.',
                param="tool_choice",
            )
        if not after_text:
            enforced = functions
        # Counted before anything is built from them: compiling is what a huge schema makes slow.
        position = {(tool.get("function") or {}).get("name"): i for i, tool in enumerate(tools)}
        check_schema_sizes(
            [
                (f"tools[{position[name]}].function.parameters", schema)
                for name, schema in enforced.items()
            ]
        )
        lark = _tool_call_lark(
            functions,
            repeat=repeat,
            after_text=after_text,
            unlexable=self._unlexable_tokens() if after_text else (),
        )
        try:
            grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        except ValueError as error:
            raise InvalidGrammarError(f"Invalid grammar: {error}", param="tools") from error
        known = self._known(grammar)
        if known is not None:
            return Grammar(grammar, known)
        # Each tool's schema alone first: an error then names the user's tool rather than
        # quoting our generated Lark, and a schema that fails at its own first token (which
        # comes after `{"name": ..., "arguments": ` in the combined grammar) is found.
        self._raise_for_first_bad_parameters(enforced)
        return Grammar(grammar, self._validated_matcher(grammar, param="tools"))

    def _unlexable_tokens(self) -> tuple[int, ...]:
        """Tokens free text must allow by id, found once: special tokens (once a grammar names a
        token by id, llguidance no longer lexes any special token as text) and tokens no lexeme
        can match (a lone 0xFF byte, which llguidance reserves to mark special tokens)."""
        if self._unlexable is None:
            grammar = llguidance.LLMatcher.grammar_from_lark(
                f"start: TEXT\n{_ANY_BYTES_LARK}TEXT: ANY_BYTES\n"
            )
            matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0, limits=_LIMITS)
            bitmask = new_bitmask(1, self.vocab_size)
            matcher.unsafe_compute_mask_ptr(
                bitmask.data_ptr(), bitmask.numel() * bitmask.element_size()
            )
            bits = (bitmask[0].view(torch.uint8).long().unsqueeze(1) >> torch.arange(8)) & 1
            banned = set((bits.view(-1)[: self.vocab_size] == 0).nonzero().flatten().tolist())
            special = {t for t in range(self.vocab_size) if self._tokenizer.is_special_token(t)}
            # EOS stays out: the matcher allows it wherever the output may end, as elsewhere.
            self._unlexable = tuple(sorted((banned | special) - set(self.eos_token_ids)))
        return self._unlexable

    def from_text(self, text: str, *, param: str = "params.grammar") -> Grammar:
        """A grammar sent as its text (`Grammar.text`: an engine replica's request carries it),
        validated against this vocabulary like any other."""
        return self._compile(lambda: text, param=param)

    def matcher(self, grammar: Grammar) -> SequenceConstraint:
        """A fresh constraint for one generated sequence, starting at the grammar's beginning."""
        return SequenceConstraint(grammar.compiled.deep_copy(), self.vocab_size)

    def _raise_for_first_bad_parameters(self, functions: dict[str, dict]) -> None:
        for name, parameters in functions.items():
            try:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(parameters)
            except ValueError as error:
                is_error, problems = True, [str(error)]
            else:
                is_error, problems = llguidance.LLMatcher.validate_grammar_with_warnings(
                    grammar, self._tokenizer, limits=_LIMITS
                )
            if is_error:
                raise InvalidGrammarError(
                    f"Cannot enforce the parameters schema of tool {name!r}: {problems[0]}",
                    param="tools",
                )
            matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0, limits=_LIMITS)
            try:
                self._check_first_mask(matcher, param="tools")
            except InvalidGrammarError as error:
                raise InvalidGrammarError(
                    f"Cannot enforce the parameters schema of tool {name!r}: {error.message}",
                    param="tools",
                ) from None

    def _compile(self, build: Callable[[], str], *, param: str) -> Grammar:
        try:
            grammar = build()
        except ValueError as error:
            raise InvalidGrammarError(f"Invalid grammar: {error}", param=param) from error
        known = self._known(grammar)
        if known is not None:
            return Grammar(grammar, known)
        return Grammar(grammar, self._validated_matcher(grammar, param=param))

    def _known(self, grammar: str) -> llguidance.LLMatcher | None:
        """The matcher of `grammar` if it was validated lately, else None."""
        with self._lock:
            validated = self._validated.get(grammar)
            if validated is not None:
                self._validated.move_to_end(grammar)
        return validated

    def _validated_matcher(self, grammar: str, *, param: str) -> llguidance.LLMatcher:
        # Building the matcher is the validation: it compiles the lexer against this vocabulary
        # and reports unsupported or unsatisfiable schemas through is_error().
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0, limits=_LIMITS)
        if matcher.is_error():
            raise InvalidGrammarError(
                f"Cannot enforce this schema or grammar: {matcher.get_error()}", param=param
            )
        self._check_first_mask(matcher, param=param)
        with self._lock:
            self._validated[grammar] = matcher
            self._validated.move_to_end(grammar)
            while len(self._validated) > _CACHED_GRAMMARS:
                self._validated.popitem(last=False)
        return matcher

    def _check_first_mask(self, matcher: llguidance.LLMatcher, *, param: str) -> None:
        # Some grammars compile and then fail at the first token: a schema that is only a
        # reference to itself (`{"$ref": "#"}`) has no first mask, and an object that requires
        # itself (`{"properties": {"a": {"$ref": "#"}}, "required": ["a"]}`) passes the lexer's
        # limits as soon as `{` is consumed. Masking and consuming one token on a copy here makes
        # them a 400 before anything is queued, instead of a generation that fails.
        first = matcher.deep_copy()
        bitmask = new_bitmask(1, self.vocab_size)
        first.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * bitmask.element_size())
        start = _first_allowed_token(bitmask[0], self.vocab_size, excluded=self.eos_token_ids)
        if start is not None and not first.is_error():
            first.consume_token(start)
        if first.is_error() or start is None:
            lines = first.get_error().strip().splitlines() if first.is_error() else []
            reason = lines[0] if lines else "no token can start the output"
            raise InvalidGrammarError(
                f"Cannot enforce this schema or grammar: it fails at its first token ({reason}). "
                "A schema that is only a reference to itself, or that requires itself, does this.",
                param=param,
            )


class SequenceConstraint:
    """The grammar state of one generated sequence: masks logits and consumes sampled tokens."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        """Wrap a matcher; use `GrammarCompiler.matcher()` rather than calling this directly."""
        self._matcher = matcher
        self.vocab_size = vocab_size

    def fill_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        """Write the allowed-token bits into row `index` of an int32 bitmask (see `new_bitmask`)."""
        row = bitmask[index]
        self._matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def apply_to_logits(self, logits_row: torch.Tensor) -> None:
        """Set the logits of disallowed tokens to -inf, in place (1-D, any float dtype)."""
        apply_constraints(logits_row.unsqueeze(0), [0], [self])

    def advance(self, token_id: int) -> None:
        """Consume a sampled token; raises if the mask should have forbidden it."""
        if not self._matcher.consume_token(token_id):
            raise BackendError(
                f"Internal error: constrained decoding sampled token {token_id}, which the "
                f"grammar does not allow ({self._matcher.get_error()}). Logits were probably "
                "not masked with this sequence's constraint before sampling."
            )

    def is_finished(self) -> bool:
        """True once the grammar is complete (or EOS was consumed): only EOS is allowed now."""
        return self._matcher.is_stopped()

    def is_accepting(self) -> bool:
        """True when the output so far is a complete match, even if it could also continue."""
        return self._matcher.is_accepting()


def apply_constraints(
    logits: torch.Tensor, rows: list[int], constraints: list[SequenceConstraint]
) -> None:
    """Mask `logits[rows[i]]` with `constraints[i]`, in place; masks computed in parallel."""
    if len(rows) != len(constraints):
        raise ValueError("apply_constraints needs exactly one constraint per row")
    if not constraints:
        return
    bitmask = new_bitmask(len(constraints), constraints[0].vocab_size)
    if len(constraints) == 1:
        constraints[0].fill_bitmask(bitmask)
    else:
        matchers = [(constraint._matcher, index) for index, constraint in enumerate(constraints)]
        row_bytes = bitmask.shape[1] * bitmask.element_size()
        _executor().unsafe_compute_mask_ptr(matchers, bitmask.data_ptr(), row_bytes, len(rows))
    # A row whose grammar allows every token (free text before a strict tool's `<tool_call>`
    # opener: most tokens of an `auto` turn) only loses the columns past the vocabulary; the
    # full bias costs milliseconds per row on a 49k vocabulary, its check microseconds.
    free = (bitmask == _all_allowed(constraints[0].vocab_size)).all(dim=1)
    if bool(free.any()):
        vocab_size = constraints[0].vocab_size
        for index in free.nonzero().flatten().tolist():
            logits[rows[index], vocab_size:] = float("-inf")
        keep = (~free).nonzero().flatten()
        if not len(keep):
            return
        bitmask = bitmask[keep]
        rows = [rows[index] for index in keep.tolist()]
    bias = _bias_from_bitmask(bitmask, logits)
    if rows == list(range(logits.shape[0])):
        logits.add_(bias)
    else:
        logits.index_add_(0, torch.tensor(rows, device=logits.device), bias)


def mask_rows(logits: torch.Tensor, constraints: dict[int, Any]) -> dict[int, Exception]:
    """Mask `logits[row]` with each row's constraint, in place: llguidance's matchers together
    (`apply_constraints`), any other constraint alone. Returns the rows whose constraint failed,
    with the error; the other rows are masked whatever one of them did."""
    together = [row for row, c in constraints.items() if isinstance(c, SequenceConstraint)]
    alone = [row for row, c in constraints.items() if not isinstance(c, SequenceConstraint)]
    if together:
        try:
            apply_constraints(logits, together, [constraints[row] for row in together])
        except Exception:  # one matcher failed: find which, row by row
            logger.exception("batched grammar masks failed; applying them one by one")
            alone = list(constraints)
    failed: dict[int, Exception] = {}
    for row in alone:
        try:
            constraints[row].apply_to_logits(logits[row])
        except Exception as error:
            logger.exception("grammar mask failed for one row")
            failed[row] = error
    return failed


@functools.cache
def _all_allowed(vocab_size: int) -> torch.Tensor:
    """The bitmask row of a grammar state that allows every token of the vocabulary."""
    row = new_bitmask(1, vocab_size)[0]
    if vocab_size % 32:
        row[-1] = (1 << (vocab_size % 32)) - 1  # the last word's bits past the vocabulary clear
    return row


def new_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """An int32 bitmask with one bit per token (bit set = allowed), all allowed."""
    return torch.full((batch_size, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def _bias_from_bitmask(bitmask: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """0 for allowed and -inf for disallowed tokens, shaped (bitmask rows, logits columns)."""
    # Looking each mask byte up in a 256 x 8 table and adding the result is branch-free, about
    # 6x faster on CPU than unpacking bits with shifts and calling masked_fill_.
    table = _BYTE_TO_BIAS.to(device=logits.device, dtype=logits.dtype)
    mask_bytes = bitmask.to(logits.device).contiguous().view(torch.uint8).view(-1)
    bias = table.index_select(0, mask_bytes.long()).view(bitmask.shape[0], -1)
    width = logits.shape[-1]
    if bias.shape[1] >= width:
        return bias[:, :width]
    return torch.nn.functional.pad(bias, (0, width - bias.shape[1]), value=float("-inf"))


def _first_allowed_token(
    bitmask_row: torch.Tensor, vocab_size: int, *, excluded: list[int]
) -> int | None:
    """The smallest token id whose bit is set in one bitmask row, `excluded` left out."""
    bits = ((bitmask_row.view(torch.uint8).long().unsqueeze(1) >> torch.arange(8)) & 1).view(-1)
    bits = bits[:vocab_size].clone()
    bits[[token for token in excluded if token < vocab_size]] = 0
    allowed = bits.nonzero()
    return int(allowed[0]) if len(allowed) else None


def _byte_to_bias_table() -> torch.Tensor:
    # Row b holds the biases of the 8 tokens whose bits are byte b (little-endian, like llguidance).
    bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return torch.zeros(256, 8).masked_fill_(bits == 0, float("-inf"))


_BYTE_TO_BIAS = _byte_to_bias_table()


@functools.cache
def _executor() -> llguidance.LLExecutor:
    # A few threads are plenty: each mask takes tens of microseconds, and the model's own
    # matmuls need the cores more.
    return llguidance.LLExecutor(num_threads=min(4, os.cpu_count() or 1))


def lark_text(grammar: str) -> str:
    """Our grammar as Lark text, the form vLLM's guidance backend takes as `grammar`.

    Tool grammars already are Lark; a response_format grammar is llguidance's JSON wrapping of
    one JSON Schema (its layout options kept inside the schema), which Lark embeds as `%json`.
    """
    if not grammar.lstrip().startswith("{"):
        return grammar
    grammars = json.loads(grammar).get("grammars") or []
    if len(grammars) != 1:
        raise BackendError(f"Cannot express a grammar of {len(grammars)} parts as Lark.")
    part = grammars[0]
    if part.get("lark_grammar"):
        return str(part["lark_grammar"])
    return f"start: %json {json.dumps(part['json_schema'])}\n"


def _function_definitions(tools: list[dict]) -> dict[str, dict]:
    """Map function name -> parameters schema for the OpenAI function tools in `tools`."""
    functions: dict[str, dict] = {}
    for tool in tools or []:
        if tool.get("type") != "function":
            continue
        function = tool.get("function") or {}
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidGrammarError("Every function tool needs a non-empty name.", param="tools")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise InvalidGrammarError(
                f"Parameters of tool {name!r} must be a JSON Schema object.", param="tools"
            )
        functions[name] = parameters
    return functions


def strict_function_names(tools: list[dict]) -> set[str]:
    """Names of the function tools marked `"strict": true`."""
    return {
        function["name"]
        for tool in tools or []
        if tool.get("type") == "function"
        and isinstance(function := tool.get("function"), dict)
        and function.get("strict") is True
    }


def _tool_call_lark(
    functions: dict[str, dict],
    *,
    repeat: bool,
    after_text: bool = False,
    unlexable: tuple[int, ...] = (),
) -> str:
    """Lark grammar: `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` blocks.

    With `after_text`, the output is either free text without the `<tool_call>` opener, or free
    text up to the first opener and then the blocks, so only what follows an opener is enforced.
    `unlexable` tokens (see `GrammarCompiler._unlexable_tokens`) are allowed in the free text.
    """
    alternatives = " | ".join(f"function_{index}" for index in range(len(functions)))
    more = ' ("\\n" tool_call)*' if repeat else ""
    if after_text:
        # llguidance's Lark (docs/syntax.md, "And/Not operators", "Lazy lexemes", "Tool
        # calling"): TEXT is every byte string without the opener, special tokens included;
        # the lazy head is text that ends at the first opener, where the call grammar takes
        # over. Two TEXT lexemes never touch, or one could end in "<tool_call" and the next
        # start with ">"; an unlexable token between them is not part of any opener.
        opener = json.dumps(_TOOL_CALL_OPEN)
        raw = f"<[{_token_ranges(unlexable)}]>" if unlexable else ""
        free = f"TEXT ({raw} TEXT)*" if raw else "TEXT"
        head = f"(TEXT {raw})* text_then_opener" if raw else "text_then_opener"
        lines = [
            f"start: {free} | opened_call{more}",
            _ANY_BYTES_LARK + f"TEXT: ~(ANY_BYTES {opener} ANY_BYTES)",
            f"text_then_opener[lazy]: ANY_BYTES {opener}",
            f'opened_call: {head} "\\n" ({alternatives}) "\\n</tool_call>"',
        ]
    else:
        lines = [f"start: tool_call{more}"]
    lines.append(f'tool_call: "<tool_call>\\n" ({alternatives}) "\\n</tool_call>"')
    for index, (name, parameters) in enumerate(functions.items()):
        call_schema = {
            "type": "object",
            "properties": {
                "name": {"const": name},
                "arguments": _rebase_local_refs(parameters, "#/properties/arguments"),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
            "x-guidance": _JSON_LAYOUT,
        }
        lines.append(f"function_{index}: %json {json.dumps(call_schema)}")
    return "\n".join(lines) + "\n"


def _token_ranges(tokens: tuple[int, ...]) -> str:
    """Sorted token ids as llguidance's `<[...]>` list: `0-2,190` for (0, 1, 2, 190)."""
    ranges: list[list[int]] = []
    for token in tokens:
        if ranges and token == ranges[-1][1] + 1:
            ranges[-1][1] = token
        else:
            ranges.append([token, token])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _rebase_local_refs(schema: Any, prefix: str) -> Any:
    """Copy of `schema` with `#/...` refs pointing into it once it is nested at `prefix`."""
    if isinstance(schema, dict):
        return {
            key: prefix + value[1:]
            if key == "$ref" and isinstance(value, str) and value.startswith("#")
            else _rebase_local_refs(value, prefix)
            for key, value in schema.items()
        }
    if isinstance(schema, list):
        return [_rebase_local_refs(item, prefix) for item in schema]
    return schema
