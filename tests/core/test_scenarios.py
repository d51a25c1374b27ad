"""Scenario generation: validated, deduplicated, asked again until enough; JSONL; the split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import art_core as art
from art_core.rewards._judge_usage import JudgeUsage
from art_core.rewards._scenarios import (
    GeneratorContextError,
    GeneratorError,
    _prompt,
    context_sizes,
    scenario_schema,
)
from art_core.rewards._structured_completion import structured_completion
from tests.support.scripted_judge import Reply, ScriptedJudge

DESCRIPTION = "A support agent for a bike shop: answers questions about repairs and opening hours."


def batch(*tasks: str, difficulty: int = 2, expected: str | None = None) -> str:
    return json.dumps(
        {"scenarios": [{"task": t, "difficulty": difficulty, "expected": expected} for t in tasks]}
    )


async def test_duplicates_and_invalid_tasks_are_dropped_and_the_rest_asked_again(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.queue(
        batch(
            "How much does a flat tyre repair cost?",
            "how much does a FLAT tyre repair cost??",  # the same once normalized
            "ok",  # too short to be a request
        ),
        batch("Are you open on Sunday mornings?", "Can you true a bent rear wheel today?"),
    )
    scenarios = await art.generate_scenarios(
        DESCRIPTION, 3, generator=judge_model, batch_size=3, cache=False
    )
    assert [s.task for s in scenarios] == [
        "How much does a flat tyre repair cost?",
        "Are you open on Sunday mornings?",
        "Can you true a bent rear wheel today?",
    ]
    second = scripted_judge.user_prompt(1)
    assert "Write 2 new tasks" in second and "already exist" in second
    assert "flat tyre repair" in second
    schema = scripted_judge.requests[1]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["scenarios"]["minItems"] == 2


async def test_tools_and_instructions_reach_the_generator(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.queue(batch("Look up the price of a chain replacement please.", difficulty=4))
    tools = [{"type": "function", "function": {"name": "price_lookup", "description": "Prices."}}]
    [scenario] = await art.generate_scenarios(
        DESCRIPTION,
        1,
        generator=judge_model,
        tools=tools,
        difficulty=(3, 5),
        custom_instructions="Write in British English.",
        cache=False,
    )
    prompt = scripted_judge.user_prompt()
    assert "- price_lookup: Prices." in prompt and "Write in British English." in prompt
    assert "from 3 (easy) to 5 (hard)" in prompt
    assert scenario.difficulty == 4 and scenario.expected is None


async def test_too_few_valid_scenarios_is_a_clear_error(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.default = Reply(batch("What time do you open?", "What time do you open?"))
    with pytest.raises(art.ScenarioGenerationError, match=r"Got 1 of 5 .* in 3 requests") as caught:
        await art.generate_scenarios(
            DESCRIPTION, 5, generator=judge_model, max_requests=3, cache=False
        )
    assert "duplicate" in str(caught.value) and "stronger generator" in str(caught.value)


async def test_an_unusable_batch_is_counted_not_fatal(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    scripted_judge.queue("[]", "nope", batch("Do you sell second-hand road bikes?"))
    [scenario] = await art.generate_scenarios(DESCRIPTION, 1, generator=judge_model, cache=False)
    assert scenario.task.startswith("Do you sell")


async def test_cached_generation_repeats_without_requests(
    scripted_judge: ScriptedJudge, judge_model: art.Model, tmp_path: Path
):
    scripted_judge.queue(batch("Can I book a service for next Tuesday?"))
    first = await art.generate_scenarios(DESCRIPTION, 1, generator=judge_model, cache=tmp_path)
    again = await art.generate_scenarios(DESCRIPTION, 1, generator=judge_model, cache=tmp_path)
    assert first == again and len(scripted_judge.requests) == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"n": 0}, "n must be >= 1"),
        ({"difficulty": (4, 2)}, "difficulty must be"),
        ({"description": "  "}, "description is empty"),
    ],
)
async def test_bad_arguments_are_rejected_before_any_request(
    scripted_judge: ScriptedJudge, judge_model: art.Model, arguments: dict, message: str
):
    call = {"description": DESCRIPTION, "n": 2, "generator": judge_model, **arguments}
    with pytest.raises(ValueError, match=message):
        await art.generate_scenarios(**call)
    assert scripted_judge.requests == []


def test_jsonl_round_trip_and_a_bad_line_named(tmp_path: Path):
    scenarios = [
        art.Scenario(task="Fix my brakes, they squeal.", difficulty=2, expected=None),
        art.Scenario(task="Is a 29er right for me?", difficulty=3, expected="Depends on height"),
    ]
    path = tmp_path / "s" / "scenarios.jsonl"
    art.save_scenarios(path, scenarios)
    assert art.load_scenarios(path) == scenarios
    path.write_text(path.read_text() + '{"task": "x"}\n')
    with pytest.raises(ValueError, match=r"scenarios.jsonl, line 3: not a scenario"):
        art.load_scenarios(path)


def test_the_split_is_deterministic_and_ignores_order():
    scenarios = [
        art.Scenario(task=f"Question number {i} about bikes", difficulty=1) for i in range(50)
    ]
    train, val = art.split_scenarios(scenarios, val_fraction=0.2, seed=7)
    assert len(val) == 10 and len(train) == 40 and not {s.id for s in train} & {s.id for s in val}
    _, val2 = art.split_scenarios(list(reversed(scenarios)), val_fraction=0.2, seed=7)
    assert {s.id for s in val2} == {s.id for s in val}
    assert {s.id for s in art.split_scenarios(scenarios, 0.2, seed=8)[1]} != {s.id for s in val}


async def test_the_tiny_model_on_our_backend_answers_the_scenario_schema(
    remote_backend: art.RemoteBackend,
):
    """Whatever a random model writes, constrained decoding makes it parse as the schema."""
    generator = art.Model(name="tiny")
    await generator.register(remote_backend)
    items = await structured_completion(
        generator,
        [{"role": "user", "content": f"Write 2 tasks for: {DESCRIPTION}"}],
        schema_name="scenarios",
        schema=scenario_schema(2, 1, 5),
        validate=lambda parsed: (parsed["scenarios"], []),
        correction=str,
        usage=JudgeUsage(),
        sampling={"temperature": 1.0, "seed": 3},
    )
    assert len(items) == 2
    for item in items:
        assert 12 <= len(item["task"]) <= 400 and 1 <= item["difficulty"] <= 5


async def test_batches_are_asked_concurrently_each_leaning_to_a_difficulty(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    counter = iter(range(100))
    scripted_judge.default = lambda body: Reply(
        batch(*(f"Distinct question number {next(counter)} about bikes" for _ in range(2)))
    )
    scenarios = await art.generate_scenarios(
        DESCRIPTION, 8, generator=judge_model, batch_size=2, concurrency=4, cache=False
    )
    assert len(scenarios) == 8 and len(scripted_judge.requests) == 4
    prompts = [scripted_judge.user_prompt(i) for i in range(4)]
    assert all("Write 2 new tasks" in p for p in prompts)
    assert {p.rsplit("difficulty ", 1)[1] for p in prompts} == {"1.", "2.", "3.", "4."}


# ------------------------------------------------------------- fitting the generator's context


async def test_batches_shrink_to_fit_a_small_context_on_our_backend(
    remote_backend: art.RemoteBackend, tiny_model_dir: Path
):
    """The tiny model's context is 2048 tokens: with this description a batch of 2 scenarios
    (550 completion tokens) does not fit, a batch of 1 does."""
    from transformers import AutoTokenizer

    description = DESCRIPTION + " It knows the price of every repair and when each shop opens." * 24
    prompt = _prompt(description, 2, None, 1, 5, None, [])
    prompt_tokens = len(AutoTokenizer.from_pretrained(tiny_model_dir)(prompt)["input_ids"])
    assert prompt_tokens + 2 * 250 + 50 > 2048  # unfitted, the first batch would be refused
    generator = art.Model(name="tiny")
    await generator.register(remote_backend)
    usage = JudgeUsage()
    try:
        scenarios = await art.generate_scenarios(
            description,
            2,
            generator,
            batch_size=2,
            max_requests=2,
            cache=False,
            sampling={"temperature": 1.0, "seed": 5},
            usage=usage,
        )
    except art.ScenarioGenerationError as error:
        # A random model may repeat itself; what matters here is that the fitted batches ran.
        assert not isinstance(error, GeneratorError), error
        assert "Got " in str(error)
    else:
        assert len(scenarios) == 2
    assert usage.requests >= 1 and usage.completion_tokens <= usage.requests * (250 + 50)


async def test_a_prompt_too_long_for_the_generator_is_a_generator_error(
    remote_backend: art.RemoteBackend,
):
    generator = art.Model(name="tiny")
    await generator.register(remote_backend)
    tools = [
        {"type": "function", "function": {"name": f"tool_{k}", "description": "Does a thing. " * 8}}
        for k in range(20)
    ]
    with pytest.raises(GeneratorContextError) as caught:
        await art.generate_scenarios(DESCRIPTION, 2, generator, tools=tools, cache=False)
    message = str(caught.value)
    assert "scenario generator tiny has a context of 2048 tokens" in message
    assert "the 20 tools" in message and "--tools" in message
    assert isinstance(caught.value, art.ScenarioGenerationError)
    assert not isinstance(caught.value, art.JudgeError)


def test_the_sizes_are_read_from_every_providers_wording():
    assert context_sizes(
        "This model's maximum context length is 2048 tokens. The prompt has 1500 tokens and "
        "max_completion_tokens is 1050, 2550 in all."
    ) == (2048, 1500)
    assert context_sizes(  # vLLM, OpenAI
        "This model's maximum context length is 4096 tokens. However, you requested 5000 "
        "tokens (3950 in the messages, 1050 in the completion)."
    ) == (4096, 3950)
    assert context_sizes(  # recent vLLM
        "'max_tokens' or 'max_completion_tokens' is too large: 1050. This model's maximum "
        "context length is 2048 tokens and your request has 1500 input tokens (1050 > 548)."
    ) == (2048, 1500)
    assert context_sizes("prompt is too long") is None


async def test_a_context_refusal_shrinks_the_batch_then_later_batches_fit_from_the_start(
    scripted_judge: ScriptedJudge, judge_model: art.Model
):
    def answer(body: dict) -> Reply:
        asked = body["max_completion_tokens"]
        prompt_chars = len(body["messages"][-1]["content"])
        if prompt_chars // 2 + asked > 1400:  # a 1400-token context, 2 characters a token
            return Reply(
                status=400,
                message=f"This model's maximum context length is 1400 tokens. The prompt has "
                f"{prompt_chars // 2} tokens and max_completion_tokens is {asked}.",
            )
        count = body["response_format"]["json_schema"]["schema"]["properties"]["scenarios"]
        return Reply(
            batch(
                *(
                    f"Distinct question {len(scripted_judge.requests)}-{k} about bikes"
                    for k in range(count["minItems"])
                )
            )
        )

    scripted_judge.default = answer
    scenarios = await art.generate_scenarios(
        DESCRIPTION, 6, judge_model, batch_size=4, concurrency=1, cache=False
    )
    assert len(scenarios) == 6
    asked = [r["max_completion_tokens"] for r in scripted_judge.requests]
    assert asked[0] == 4 * 250 + 50  # refused
    assert all(tokens < asked[0] for tokens in asked[1:])  # then only what fits
    refused = [r for r in asked if r == asked[0]]
    assert len(refused) == 1
