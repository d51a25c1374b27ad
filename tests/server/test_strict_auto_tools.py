"""`strict: true` tools on `tool_choice="auto"` turns: free text stays free, opened calls fit.

The tiny model is random and never writes `<tool_call>` on its own, so the enforcement tests
write the opener for it (consumed through the constraint as if sampled) and let it sample the
rest at temperature 1; the server tests check that plain text is untouched and bad schemas are
a 400.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from art_backend.engines._constrained import Grammar, GrammarCompiler, SequenceConstraint
from art_backend.engines._kv_cache import cache_keyword
from art_backend.engines._tool_calls import render_tools_system_prompt
from art_backend.testing import InvalidGrammarError

FRUIT = {
    "type": "object",
    "properties": {
        "fruit": {"enum": ["apples", "oranges"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["fruit", "count"],
    "additionalProperties": False,
}


def pick_tool(*, strict: bool | None) -> dict:
    """The `pick` function in the key order the server dumps it (so prompts can be rebuilt)."""
    function: dict[str, Any] = {"name": "pick", "parameters": FRUIT}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


LOOSE_TOOL = {"type": "function", "function": {"name": "note", "parameters": FRUIT}}
OPENER = "<tool_call>"
CALL_BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
SAMPLES = 24
MAX_NEW_TOKENS = 80


def fits_fruit(arguments: Any) -> bool:
    return (
        isinstance(arguments, dict)
        and set(arguments) == {"fruit", "count"}
        and arguments["fruit"] in ("apples", "oranges")
        and isinstance(arguments["count"], int)
        and not isinstance(arguments["count"], bool)
        and 0 <= arguments["count"] <= 9
    )


def call_fits(block: str, *, loose_names: tuple[str, ...] = ()) -> bool:
    """True when a `<tool_call>` body is a call of `pick` with valid arguments (or a loose tool)."""
    try:
        call = json.loads(block)
    except json.JSONDecodeError:
        return False
    if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
        return False
    if call["name"] in loose_names:
        return isinstance(call["arguments"], dict)
    return call["name"] == "pick" and fits_fruit(call["arguments"])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, [tokenizer.eos_token_id])


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def consumes(compiler: GrammarCompiler, grammar: Grammar, tokenizer: Any, text: str) -> bool | None:
    """None if the grammar rejects `text`; else whether `text` is a complete output."""
    constraint = compiler.matcher(grammar)
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not constraint._matcher.consume_token(token):
            return None
    return constraint.is_accepting()


def call_text(name: str, arguments: Any) -> str:
    return f"{OPENER}\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# --- which requests get a grammar -------------------------------------------------------------


@pytest.mark.parametrize("strict", [None, False])
def test_auto_without_strict_tools_needs_no_grammar(compiler: GrammarCompiler, strict) -> None:
    tools = [pick_tool(strict=strict), LOOSE_TOOL]
    assert compiler.for_tool_choice(tools, "auto", parallel_tool_calls=True) is None


def test_none_tool_choice_ignores_strict_tools(compiler: GrammarCompiler) -> None:
    assert compiler.for_tool_choice([pick_tool(strict=True)], "none", True) is None


def test_unenforceable_strict_schema_is_rejected(compiler: GrammarCompiler) -> None:
    tool: dict[str, Any] = {
        "type": "function",
        "function": {"name": "f", "parameters": {"$ref": "#"}, "strict": True},
    }
    with pytest.raises(InvalidGrammarError, match="tool 'f'") as raised:
        compiler.for_tool_choice([tool], "auto", parallel_tool_calls=True)
    assert raised.value.param == "tools"


def test_a_loose_tool_with_an_unenforceable_schema_is_not_compiled(
    compiler: GrammarCompiler,
) -> None:
    loose = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}
    grammar = compiler.for_tool_choice([pick_tool(strict=True), loose], "auto", True)
    assert grammar is not None


# --- what the auto grammar accepts ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", True),
        ("The capital of France is Paris.\n{not a call} <tool_ call>", True),
        (call_text("pick", {"fruit": "oranges", "count": 2}), True),
        ("Let me check. " + call_text("pick", {"fruit": "apples", "count": 0}), True),
        (call_text("note", {"anything": [1, "x"]}), True),  # not strict: any JSON object
        (call_text("pick", {"fruit": "orange", "count": 2}), None),  # not in the enum
        (call_text("pick", {"fruit": "apples"}), None),  # missing a required property
        (call_text("other", {}), None),  # not a tool
        (call_text("note", "not an object"), None),
        ("Sure <tool_call> pick", None),  # the opener starts a call, whatever follows
        (call_text("pick", {"fruit": "apples", "count": 1}) + " and some text", None),
        ("Let me check. <tool_call>\n", False),  # open, not complete
    ],
)
def test_free_text_or_calls_whose_strict_arguments_fit(
    compiler: GrammarCompiler, tokenizer: Any, text: str, expected: bool | None
) -> None:
    grammar = compiler.for_tool_choice([pick_tool(strict=True), LOOSE_TOOL], "auto", True)
    assert grammar is not None
    assert consumes(compiler, grammar, tokenizer, text) is expected


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_decides_whether_a_second_call_may_follow(
    compiler: GrammarCompiler, tokenizer: Any, parallel: bool
) -> None:
    grammar = compiler.for_tool_choice([pick_tool(strict=True)], "auto", parallel)
    assert grammar is not None
    one = call_text("pick", {"fruit": "apples", "count": 1})
    two = f"{one}\n{call_text('pick', {'fruit': 'oranges', 'count': 3})}"
    assert consumes(compiler, grammar, tokenizer, one) is True
    assert consumes(compiler, grammar, tokenizer, two) is (True if parallel else None)


def test_free_text_masks_no_token(compiler: GrammarCompiler, tokenizer: Any) -> None:
    # Special tokens, lone bytes that are not UTF-8 on their own, and the byte 0xFF (which
    # llguidance's lexer cannot match) all stay allowed, before and after some text.
    grammar = compiler.for_tool_choice([pick_tool(strict=True)], "auto", True)
    assert grammar is not None
    constraint = compiler.matcher(grammar)
    for token in [*tokenizer.encode("Hi <tool", add_special_tokens=False), None]:
        logits = torch.zeros(len(tokenizer))
        constraint.apply_to_logits(logits)
        assert torch.isfinite(logits).all()
        if token is not None:
            constraint.advance(token)
    for token in [tokenizer.convert_tokens_to_ids("ÿ"), tokenizer.bos_token_id]:
        constraint.advance(token)
    assert constraint.is_accepting()


# --- sampling from the real tiny model ---------------------------------------------------------


def sample_after_opener(
    model: Any, tokenizer: Any, constraint: SequenceConstraint | None, seed: int
) -> str:
    """Prompt, then `Sure. <tool_call>` as if sampled, then sample at temperature 1 until done."""
    prompt = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": render_tools_system_prompt([pick_tool(strict=True)])},
            {"role": "user", "content": "Pick a fruit."},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    forced = tokenizer.encode("Sure. " + OPENER, add_special_tokens=False)
    if constraint is not None:
        for token in forced:
            constraint.advance(token)
    generator = torch.Generator().manual_seed(seed)
    ids = tokenizer.encode(prompt, add_special_tokens=False) + forced
    generated = list(forced)
    cache = DynamicCache(config=model.config)  # filled in place by each forward
    keyword = cache_keyword(model)
    next_input = ids
    for _ in range(MAX_NEW_TOKENS):
        with torch.no_grad():
            output = model(torch.tensor([next_input]), **{keyword: cache}, use_cache=True)
        logits = output.logits[0, -1].clone()
        if constraint is not None:
            constraint.apply_to_logits(logits)
        token = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))
        if token == tokenizer.eos_token_id:
            break
        if constraint is not None:
            constraint.advance(token)
        generated.append(token)
        next_input = [token]
        if constraint is not None and constraint.is_finished():
            break
    return tokenizer.decode(generated)


def test_sampled_calls_fit_the_strict_schema_and_unconstrained_ones_do_not(
    compiler: GrammarCompiler, tokenizer: Any, model: Any
) -> None:
    # One call, so each sample ends with EOS right after it rather than chaining calls.
    grammar = compiler.for_tool_choice([pick_tool(strict=True)], "auto", parallel_tool_calls=False)
    assert grammar is not None
    constrained, free = [], []
    for seed in range(SAMPLES):
        constrained.append(sample_after_opener(model, tokenizer, compiler.matcher(grammar), seed))
        free.append(sample_after_opener(model, tokenizer, None, seed))

    for text in constrained:
        blocks = CALL_BLOCK.findall(text)
        # The opener became one complete, valid call (nothing was cut by MAX_NEW_TOKENS).
        assert len(blocks) == 1 and text.count(OPENER) == 1, text
        assert all(call_fits(block) for block in blocks), text
    # The same sampling without the grammar writes calls that do not fit: the test can fail.
    assert not any(
        (blocks := CALL_BLOCK.findall(text)) and all(call_fits(block) for block in blocks)
        for text in free
    )


# --- through the server -----------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "Pick a fruit for me."}]
# The random model's greedy text is one token repeated; a penalty makes it varied yet fixed.
VARIED_GREEDY = {"temperature": 0.0, "frequency_penalty": 2.0, "max_tokens": 40}


@pytest.fixture(scope="module")
def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def streamed_text(stream: Any) -> str:
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


@pytest.mark.parametrize("stream", [False, True])
def test_plain_text_is_the_same_with_and_without_strict_tools(sdk: Any, stream: bool) -> None:
    tools = [pick_tool(strict=True)]
    # The same prompt without tools: the system prompt the server writes for them, by hand.
    untooled = [{"role": "system", "content": render_tools_system_prompt(tools)}, *MESSAGES]
    with_tools = dict(model="tiny", messages=MESSAGES, tools=tools, **VARIED_GREEDY)
    without = dict(model="tiny", messages=untooled, **VARIED_GREEDY)
    if stream:
        strict_text = streamed_text(sdk.chat.completions.create(**with_tools, stream=True))
        plain_text = streamed_text(sdk.chat.completions.create(**without, stream=True))
    else:
        strict_choice = sdk.chat.completions.create(**with_tools, logprobs=True).choices[0]
        plain_choice = sdk.chat.completions.create(**without, logprobs=True).choices[0]
        assert strict_choice.message.tool_calls is None
        assert strict_choice.finish_reason == plain_choice.finish_reason
        assert [entry.token for entry in strict_choice.logprobs.content] == [
            entry.token for entry in plain_choice.logprobs.content
        ]
        strict_text, plain_text = strict_choice.message.content, plain_choice.message.content
    assert OPENER not in plain_text
    assert len(set(plain_text)) > 3  # varied text, not one repeated token
    assert strict_text == plain_text


def test_seeded_samples_are_the_same_with_and_without_strict_tools(sdk: Any) -> None:
    # n > 1, sampling and top logprobs: free text masks nothing, so every choice draws the same
    # tokens with the same log-probabilities as without the grammar.
    tools = [pick_tool(strict=True), LOOSE_TOOL]
    untooled = [{"role": "system", "content": render_tools_system_prompt(tools)}, *MESSAGES]
    sampling = dict(n=3, seed=7, temperature=1.0, max_tokens=30, logprobs=True, top_logprobs=2)
    strict = sdk.chat.completions.create(model="tiny", messages=MESSAGES, tools=tools, **sampling)
    plain = sdk.chat.completions.create(model="tiny", messages=untooled, **sampling)

    def sampled(response: Any) -> list[tuple]:
        return [
            (
                choice.message.content,
                [
                    (entry.token, round(entry.logprob, 4), [t.token for t in entry.top_logprobs])
                    for entry in choice.logprobs.content
                ],
            )
            for choice in response.choices
        ]

    assert len(strict.choices) == 3
    assert all(choice.message.tool_calls is None for choice in strict.choices)
    assert len({content for content, _ in sampled(plain)}) == 3  # the samples differ
    assert sampled(strict) == sampled(plain)


def test_an_unenforceable_strict_tool_is_a_400(sdk: Any) -> None:
    tool: dict[str, Any] = {
        "type": "function",
        "function": {"name": "f", "parameters": {"$ref": "#"}, "strict": True},
    }
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.chat.completions.create(model="tiny", messages=MESSAGES, tools=[tool], max_tokens=4)
    assert "tool 'f'" in raised.value.message
    # Without strict the schema is not enforced on auto turns, so the request is served.
    del tool["function"]["strict"]
    response = sdk.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=[tool], max_tokens=4
    )
    assert response.choices[0].finish_reason in ("stop", "length")
