"""Grammar-constrained decoding: whatever a random model prefers, the output obeys the grammar."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from art_backend.engines._constrained import GrammarCompiler, SequenceConstraint, apply_constraints
from art_backend.engines._kv_cache import cache_keyword
from art_backend.testing import BackendError, InvalidGrammarError

MAX_NEW_TOKENS = 200

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 0, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["city", "days", "unit", "tags"],
    "additionalProperties": False,
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city {as JSON}.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/small"}, "b": {"$ref": "#/$defs/small"}},
                "required": ["a", "b"],
                "additionalProperties": False,
                "$defs": {"small": {"type": "integer", "minimum": -99, "maximum": 99}},
            },
        },
    },
]

TOOL_CALL_BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Iterator[Any]:
    # A 64-wide model gains nothing from intra-op threads; on shared cores they only spin-wait.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, [tokenizer.eos_token_id])


def generate(
    model: Any,
    tokenizer: Any,
    constraint: SequenceConstraint,
    *,
    temperature: float = 0.0,
    seed: int = 0,
) -> str:
    """Decode under `constraint` until EOS or the grammar is complete; fail on running out."""
    generator = torch.Generator().manual_seed(seed)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the weather in Paris?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    next_input = tokenizer.encode(prompt, add_special_tokens=False)
    cache = DynamicCache(config=model.config)  # filled in place by each forward
    keyword = cache_keyword(model)
    generated: list[int] = []
    for _ in range(MAX_NEW_TOKENS):
        with torch.no_grad():
            output = model(torch.tensor([next_input]), **{keyword: cache}, use_cache=True)
        logits = output.logits[0, -1].clone()
        constraint.apply_to_logits(logits)
        if temperature == 0.0:
            token = int(logits.argmax())
        else:
            probabilities = torch.softmax(logits / temperature, dim=-1)
            token = int(torch.multinomial(probabilities, 1, generator=generator))
        constraint.advance(token)
        if token == tokenizer.eos_token_id:
            return tokenizer.decode(generated)
        generated.append(token)
        next_input = [token]
        if constraint.is_finished():
            return tokenizer.decode(generated)
    pytest.fail(f"no end within {MAX_NEW_TOKENS} tokens: {tokenizer.decode(generated)!r}")


def assert_matches_weather_schema(value: Any) -> None:
    assert isinstance(value, dict)
    assert set(value) == {"city", "days", "unit", "tags"}
    assert isinstance(value["city"], str) and len(value["city"]) <= 12
    assert isinstance(value["days"], int) and 0 <= value["days"] <= 14
    assert value["unit"] in ("celsius", "fahrenheit")
    assert isinstance(value["tags"], list) and len(value["tags"]) <= 3
    assert all(isinstance(tag, str) and len(tag) <= 6 for tag in value["tags"])


def assert_valid_tool_call(call: Any) -> None:
    assert set(call) == {"name", "arguments"}
    arguments = call["arguments"]
    if call["name"] == "get_weather":
        assert set(arguments) == {"city"}
        assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 10
    else:
        assert call["name"] == "add"
        assert set(arguments) == {"a", "b"}
        assert all(isinstance(arguments[key], int) for key in "ab")
        assert all(-99 <= arguments[key] <= 99 for key in "ab")


def tool_calls_in(text: str) -> list[dict]:
    """Parse text made only of `<tool_call>` blocks separated by newlines."""
    blocks = TOOL_CALL_BLOCK.findall(text)
    assert "\n".join(f"<tool_call>\n{block}\n</tool_call>" for block in blocks) == text
    return [json.loads(block) for block in blocks]


# --- what needs no grammar -------------------------------------------------------------------


@pytest.mark.parametrize("response_format", [None, {"type": "text"}])
def test_free_text_response_formats_need_no_grammar(
    compiler: GrammarCompiler, response_format: dict | None
) -> None:
    assert compiler.for_response_format(response_format) is None


@pytest.mark.parametrize("tool_choice", ["none", "auto"])
def test_optional_tool_choices_need_no_grammar(compiler: GrammarCompiler, tool_choice: str) -> None:
    assert compiler.for_tool_choice(TOOLS, tool_choice, parallel_tool_calls=True) is None


# --- response_format --------------------------------------------------------------------------


def test_json_object_output_is_a_json_object(
    compiler: GrammarCompiler, model: Any, tokenizer: Any
) -> None:
    grammar = compiler.for_response_format({"type": "json_object"})
    assert grammar is not None
    text = generate(model, tokenizer, compiler.matcher(grammar))
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_output_validates_against_the_schema(
    compiler: GrammarCompiler, model: Any, tokenizer: Any, seed: int
) -> None:
    grammar = compiler.for_response_format(
        {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA}}
    )
    assert grammar is not None
    text = generate(model, tokenizer, compiler.matcher(grammar), temperature=1.0, seed=seed)
    assert_matches_weather_schema(json.loads(text))


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"pattern": "(?=a)"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": "not a schema"}},
        {"type": "json_schema"},
        {"type": "xml"},
    ],
)
def test_unusable_response_formats_are_rejected_before_generation(
    compiler: GrammarCompiler, response_format: dict
) -> None:
    with pytest.raises(InvalidGrammarError) as raised:
        compiler.for_response_format(response_format)
    assert raised.value.param == "response_format"
    assert raised.value.status_code == 400


# --- tool_choice ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_tool_choice_outputs_only_valid_tool_call_blocks(
    compiler: GrammarCompiler, model: Any, tokenizer: Any, seed: int
) -> None:
    grammar = compiler.for_tool_choice(TOOLS, "required", parallel_tool_calls=True)
    assert grammar is not None
    text = generate(model, tokenizer, compiler.matcher(grammar), temperature=1.0, seed=seed)
    calls = tool_calls_in(text)
    assert calls
    for call in calls:
        assert_valid_tool_call(call)


def test_required_tool_choice_without_parallel_calls_stops_after_one_block(
    compiler: GrammarCompiler, model: Any, tokenizer: Any
) -> None:
    grammar = compiler.for_tool_choice(TOOLS, "required", parallel_tool_calls=False)
    assert grammar is not None
    constraint = compiler.matcher(grammar)
    calls = tool_calls_in(generate(model, tokenizer, constraint, temperature=1.0, seed=2))
    assert len(calls) == 1
    assert constraint.is_finished()


@pytest.mark.parametrize("seed", [0, 1])
def test_named_tool_choice_forces_that_function(
    compiler: GrammarCompiler, model: Any, tokenizer: Any, seed: int
) -> None:
    tool_choice = {"type": "function", "function": {"name": "add"}}
    grammar = compiler.for_tool_choice(TOOLS, tool_choice, parallel_tool_calls=True)
    assert grammar is not None
    text = generate(model, tokenizer, compiler.matcher(grammar), temperature=1.0, seed=seed)
    (call,) = tool_calls_in(text)
    assert call["name"] == "add"
    assert_valid_tool_call(call)


def test_unknown_named_function_is_rejected(compiler: GrammarCompiler) -> None:
    tool_choice = {"type": "function", "function": {"name": "launch_rocket"}}
    with pytest.raises(InvalidGrammarError, match="launch_rocket") as raised:
        compiler.for_tool_choice(TOOLS, tool_choice, parallel_tool_calls=False)
    assert raised.value.param == "tool_choice"


def test_required_tool_choice_without_tools_is_rejected(compiler: GrammarCompiler) -> None:
    with pytest.raises(InvalidGrammarError) as raised:
        compiler.for_tool_choice([], "required", parallel_tool_calls=False)
    assert raised.value.param == "tools"


def test_invalid_tool_parameters_schema_is_rejected(compiler: GrammarCompiler) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}]
    with pytest.raises(InvalidGrammarError, match="tool 'f'") as raised:
        compiler.for_tool_choice(tools, "required", parallel_tool_calls=False)
    assert raised.value.param == "tools"


# --- masks, EOS and the engine-facing contract ------------------------------------------------


def allowed_tokens(constraint: SequenceConstraint, width: int) -> list[int]:
    logits = torch.zeros(width)
    constraint.apply_to_logits(logits)
    return torch.isfinite(logits).nonzero().flatten().tolist()


def test_completed_grammar_allows_only_eos(compiler: GrammarCompiler, tokenizer: Any) -> None:
    grammar = compiler.for_tool_choice(
        TOOLS, {"type": "function", "function": {"name": "add"}}, parallel_tool_calls=False
    )
    assert grammar is not None
    constraint = compiler.matcher(grammar)
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert not constraint.is_finished()
        constraint.advance(token)
    assert constraint.is_finished()
    assert allowed_tokens(constraint, len(tokenizer)) == [tokenizer.eos_token_id]


def test_eos_is_allowed_but_not_forced_between_parallel_tool_calls(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    grammar = compiler.for_tool_choice(TOOLS, "required", parallel_tool_calls=True)
    assert grammar is not None
    constraint = compiler.matcher(grammar)
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    for token in tokenizer.encode(text, add_special_tokens=False):
        constraint.advance(token)
    assert not constraint.is_finished()
    allowed = allowed_tokens(constraint, len(tokenizer))
    assert tokenizer.eos_token_id in allowed
    assert tokenizer.encode("\n", add_special_tokens=False)[0] in allowed

    second = '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for token in tokenizer.encode(second, add_special_tokens=False):
        constraint.advance(token)
    assert tokenizer.eos_token_id in allowed_tokens(constraint, len(tokenizer))


def test_logit_columns_beyond_the_tokenizer_are_never_allowed(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    grammar = compiler.for_response_format({"type": "json_object"})
    assert grammar is not None
    padded_width = len(tokenizer) + 64
    allowed = allowed_tokens(compiler.matcher(grammar), padded_width)
    assert allowed
    assert max(allowed) < len(tokenizer)


def test_bfloat16_logits_are_masked_like_float32(compiler: GrammarCompiler, tokenizer: Any) -> None:
    grammar = compiler.for_response_format({"type": "json_object"})
    assert grammar is not None
    constraint = compiler.matcher(grammar)
    logits = torch.zeros(len(tokenizer), dtype=torch.bfloat16)
    constraint.apply_to_logits(logits)
    allowed = torch.isfinite(logits).nonzero().flatten().tolist()
    assert allowed == allowed_tokens(constraint, len(tokenizer))


def test_batched_masks_match_per_row_masks_and_skip_other_rows(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    object_grammar = compiler.for_response_format({"type": "json_object"})
    tool_grammar = compiler.for_tool_choice(TOOLS, "required", parallel_tool_calls=True)
    assert object_grammar is not None and tool_grammar is not None
    constraints = [compiler.matcher(object_grammar), compiler.matcher(tool_grammar)]
    constraints[0].advance(tokenizer.encode("{", add_special_tokens=False)[0])
    logits = torch.randn(4, len(tokenizer))
    untouched = logits.clone()

    apply_constraints(logits, [3, 1], constraints)

    for row, constraint in zip([3, 1], constraints, strict=True):
        expected = untouched[row].clone()
        constraint.apply_to_logits(expected)
        assert torch.equal(logits[row], expected)
    assert torch.equal(logits[0], untouched[0])
    assert torch.equal(logits[2], untouched[2])


def test_rows_whose_grammar_allows_every_token_keep_their_logits(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    """Free text of a strict-tools `auto` turn skips the bias (only columns past the vocabulary
    go), while a row inside a tool call is still masked like the per-row path."""
    strict = [{**tool, "function": {**tool["function"], "strict": True}} for tool in TOOLS]
    grammar = compiler.for_tool_choice(strict, "auto", parallel_tool_calls=False)
    assert grammar is not None
    free_text, in_call = compiler.matcher(grammar), compiler.matcher(grammar)
    for token in tokenizer.encode("<tool_call>\n", add_special_tokens=False):
        in_call.advance(token)
    vocab = compiler.vocab_size
    logits = torch.randn(3, vocab + 5)  # a model vocabulary padded past the tokenizer's
    untouched = logits.clone()

    apply_constraints(logits, [0, 2], [free_text, in_call])

    assert torch.equal(logits[0, :vocab], untouched[0, :vocab])
    assert torch.isinf(logits[0, vocab:]).all()
    expected = untouched[2].clone()
    in_call.apply_to_logits(expected)
    assert torch.equal(logits[2], expected) and torch.isfinite(logits[2]).sum() < vocab / 2
    assert torch.equal(logits[1], untouched[1])


def test_advancing_with_a_disallowed_token_is_an_internal_error(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    grammar = compiler.for_response_format({"type": "json_object"})
    assert grammar is not None
    constraint = compiler.matcher(grammar)
    with pytest.raises(BackendError, match="does not allow"):
        constraint.advance(tokenizer.encode("x", add_special_tokens=False)[0])


def test_each_sequence_gets_its_own_state(compiler: GrammarCompiler, tokenizer: Any) -> None:
    grammar = compiler.for_response_format({"type": "json_object"})
    assert grammar is not None
    first, second = compiler.matcher(grammar), compiler.matcher(grammar)
    first.advance(tokenizer.encode("{", add_special_tokens=False)[0])
    assert allowed_tokens(second, len(tokenizer)) != allowed_tokens(first, len(tokenizer))
