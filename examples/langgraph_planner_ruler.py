"""Train a LangGraph graph (planner, two parallel branches, a subgraph) with RULER rewards, on CPU.

The graph answers a bike shop's customers: a planner outlines the reply, two branches draft its
two parts in parallel (the answer, the next step for the customer), and a subgraph (a compiled
StateGraph used as a node) writes the final reply from the drafts and tidies it. The graph is
plain LangGraph; its chat model is `art_langgraph.TrainableChatModel(model)`. Each graph run is
one rollout and one trajectory: the planner's call is its main conversation, the branches' and
the writer's calls are its additional histories, all trained with the run's reward.

There is no reward code: RULER (an LLM judge that sees the runs of a group side by side and
scores them relative to each other) gives the rewards, `after_each=ruler_score_group` in
`gather_trajectory_groups`. The held-out evaluation is judged by RULER too (each reply alone),
next to a code check the judge never sees: does the reply state the fact that answers the
question (the price, the hours, the address)?

    python examples/langgraph_planner_ruler.py                             # judge: the base model
    python examples/langgraph_planner_ruler.py --judge openai/gpt-4.1-mini # OPENAI_API_KEY

By default the judge is SmolLM2-135M-Instruct itself, served by the same backend, so this runs
offline. A 135M judge is a weak judge: it often gives every run of a group the same score, and
a tied group teaches GRPO nothing. Use a stronger judge for real training. Measured here
(defaults): the judge tied 11 of 16 training groups; it scored 6 of 8 held-out replies 1.0
before training and 7 of 8 after (0.752 -> 0.876), "The shop is open on Sunday" included, while
the code check stayed at 0/8: the pipeline runs end to end, the judge's rewards do not track
correctness.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langgraph.graph import END, START, StateGraph

sys.path.insert(0, str(Path(__file__).resolve().parent))

from smollm2 import smollm2_trainable

import art_core as art
import art_langgraph
from art_core.report import Evaluation, mean_metric, print_summary, summarize, write_report

SHOP = (
    "You work for Rolling Wheels, a bike shop at 12 Canal Street. Opening hours: 9am to 6pm, "
    "Monday to Saturday; closed on Sunday. Fixing a flat tire costs 15 euros and is done the "
    "same day. A full service costs 60 euros and takes two days. Renting a bike costs 20 "
    "euros a day, helmet included."
)
RUBRIC = (
    "Judge the final reply to the customer (when a run has several conversations, the writer's "
    "reply in the last one). Best: it answers the customer's question correctly with the "
    "shop's facts, in one to three friendly sentences, and says what to do next. Worse: a wrong "
    "or missing fact, made-up details, rambling, or a reply that does not address the question."
)


@dataclass(frozen=True)
class Question:
    text: str
    facts: tuple[str, ...]  # the reply states the answer when it contains one of these

    def answered_by(self, reply: str) -> bool:
        return any(re.search(rf"\b{re.escape(f)}\b", reply, re.IGNORECASE) for f in self.facts)


TOPICS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("How much does it cost to fix a flat tire?", "What do you charge for a puncture repair?",
      "My tire is flat, what will the repair cost?"), ("15",)),
    (("How much is a full service for my bike?", "What is the price of a complete bike service?",
      "I need my bike serviced. How much is it?"), ("60",)),
    (("How long does a full service take?", "If I bring my bike for a service, when is it ready?",
      "How many days do you need for a complete service?"), ("two days", "2 days")),
    (("Can I rent a bike, and what does it cost?", "How much is a rental bike per day?",
      "What is your daily rate for renting a bike?"), ("20",)),
    (("Are you open on Sunday?", "Can I come by on Sunday morning?",
      "Is the shop open this Sunday?"), ("closed", "not open")),
    (("What time do you open on Saturday?", "When are you open during the week?",
      "What are your opening hours?"), ("9", "9am", "9 am")),
    (("Where is your shop?", "What is your address?", "How do I find the shop?"),
     ("Canal",)),
    (("Do I need to bring a helmet when I rent a bike?", "Is a helmet included with a rental?",
      "Do rentals come with a helmet?"), ("included", "helmet included")),
]  # fmt: skip
OPENERS = ("", "Hi! ", "Hello, ", "Good morning. ")
JUDGE_SAMPLING = {"temperature": 0.0}  # a deterministic judge: repeatable, and its cache hits


def split_questions(held_out: int, seed: int = 0) -> tuple[list[Question], list[Question]]:
    """Train and held-out questions: held-out phrasings never appear in training."""
    rng = random.Random(seed)
    phrasings = [(text, facts) for texts, facts in TOPICS for text in texts]
    rng.shuffle(phrasings)
    held, train = phrasings[:held_out], phrasings[held_out:]
    train_questions = [Question(o + text, facts) for text, facts in train for o in OPENERS]
    rng.shuffle(train_questions)
    return train_questions, [Question(text, facts) for text, facts in held]


class State(TypedDict, total=False):
    question: str
    plan: str
    answer_draft: str
    next_step_draft: str
    reply: str


class WriterState(TypedDict, total=False):  # the subgraph sees only these keys
    question: str
    answer_draft: str
    next_step_draft: str
    reply: str


def build_graph(llm: BaseChatModel, max_tokens: int) -> Any:
    """planner -> (answer | next step, in parallel) -> writer subgraph (write -> tidy)."""

    async def ask(instruction: str, tokens: int) -> str:
        reply = await llm.bind(max_tokens=tokens).ainvoke([("system", SHOP), ("user", instruction)])
        return str(reply.content).strip()

    async def planner(state: State) -> State:
        plan = await ask(
            f"Customer: {state['question']}\nIn one short line, plan the reply: which shop fact "
            "answers the question, and what the customer should do next.",
            max_tokens // 2,
        )
        return {"plan": plan}

    async def answer(state: State) -> State:
        draft = await ask(
            f"Customer: {state['question']}\nPlan: {state['plan']}\nWrite one sentence that "
            "answers the question with the shop's facts.",
            max_tokens // 2,
        )
        return {"answer_draft": draft}

    async def next_step(state: State) -> State:
        draft = await ask(
            f"Customer: {state['question']}\nPlan: {state['plan']}\nWrite one sentence that "
            "tells the customer what to do next.",
            max_tokens // 2,
        )
        return {"next_step_draft": draft}

    async def write(state: WriterState) -> WriterState:
        reply = await ask(
            f"Customer: {state['question']}\nDraft answer: {state['answer_draft']}\nDraft next "
            f"step: {state['next_step_draft']}\nWrite the final reply to the customer: one to "
            "three friendly sentences, nothing else.",
            max_tokens,
        )
        return {"reply": reply}

    def tidy(state: WriterState) -> WriterState:
        # Code, not a model: drop a "Reply:" label and keep at most three sentences.
        reply = re.sub(r"^\s*(final reply|reply)\s*:\s*", "", state["reply"], flags=re.I)
        sentences = re.split(r"(?<=[.!?])\s+", reply.strip())
        return {"reply": " ".join(sentences[:3])}

    writer = StateGraph(WriterState)
    writer.add_node("write", write)
    writer.add_node("tidy", tidy)
    writer.add_edge(START, "write")
    writer.add_edge("write", "tidy")
    writer.add_edge("tidy", END)

    graph = StateGraph(State)
    graph.add_node("planner", planner)
    graph.add_node("answer", answer)
    graph.add_node("next_step", next_step)
    graph.add_node("writer", writer.compile())
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "answer")
    graph.add_edge("planner", "next_step")
    graph.add_edge(["answer", "next_step"], "writer")
    graph.add_edge("writer", END)
    return graph.compile()


async def rollout(model: art.TrainableModel, graph: Any, question: Question) -> art.Trajectory:
    """One run of the graph; the reward comes later, from the judge."""
    async with art_langgraph.rollout(model, scenario=question.text) as r:
        state = await graph.ainvoke({"question": question.text})
        r.metrics["states_fact"] = float(question.answered_by(state["reply"]))
        r.metrics["reply_words"] = float(len(state["reply"].split()))
        r.metadata["reply"] = state["reply"]
    return r.trajectory


async def evaluate(
    model: art.TrainableModel,
    graph: Any,
    held_out: list[Question],
    judge: art.Model | str,
    usage: art.JudgeUsage,
) -> Evaluation:
    """Greedy runs on the held-out questions: the judge's score of each final reply alone, and
    the code check."""
    trajectories = await asyncio.gather(*(rollout(model, graph, q) for q in held_out))
    scores = await asyncio.gather(
        *(
            art.ruler([_final_exchange(q, t)], judge, RUBRIC, sampling=JUDGE_SAMPLING, usage=usage)
            for q, t in zip(held_out, trajectories, strict=True)
        )
    )
    for trajectory, [score] in zip(trajectories, scores, strict=True):
        trajectory.reward = score.score
        trajectory.logs.append(f"RULER: {score.explanation}")
    await model.log([art.TrajectoryGroup(trajectories)], split="val")
    evaluation = summarize(
        model.step,
        [t.reward for t in trajectories],
        states_fact=[t.metrics["states_fact"] for t in trajectories],
        reply_words=[t.metrics["reply_words"] for t in trajectories],
    )
    evaluation.examples = [
        {"prompt": q.text, "answer": t.metadata["reply"], "reward": t.reward}
        for q, t in zip(held_out, trajectories, strict=True)
    ]
    return evaluation


def _final_exchange(question: Question, trajectory: art.Trajectory) -> list[dict[str, str]]:
    """What the judge sees of a held-out run: the shop, the question and the final reply."""
    return [
        {"role": "system", "content": SHOP},
        {"role": "user", "content": question.text},
        {"role": "assistant", "content": trajectory.metadata["reply"]},
    ]


async def main(args: argparse.Namespace) -> None:
    started = time.monotonic()
    train_questions, held_out = split_questions(args.eval_size, seed=args.seed)
    backend = art.LocalBackend(path=args.path)
    model = smollm2_trainable(args.name or time.strftime("planner-%Y%m%d-%H%M%S"), "langgraph")
    print(f"Starting the backend (SmolLM2-135M-Instruct on CPU) under {args.path}/ ...")
    await model.register(backend)
    judge = await art.judge_or_base_model(args.judge, backend, "smollm2-135m-instruct")
    if not args.judge:
        print(
            "Judge: SmolLM2-135M-Instruct itself. A 135M judge is weak: expect noisy, often tied "
            "scores that do not track correctness (--judge provider/model for a real one)."
        )
    usage = art.JudgeUsage()
    sampled = build_graph(
        art_langgraph.TrainableChatModel(model, temperature=args.temperature), args.max_tokens
    )
    greedy = build_graph(art_langgraph.TrainableChatModel(model, temperature=0.0), args.max_tokens)
    score_group = functools.partial(
        art.ruler_score_group,
        judge=judge,
        rubric=RUBRIC,
        swallow_exceptions=True,
        sampling=JUDGE_SAMPLING,
        usage=usage,
    )
    config = art.TrainConfig(learning_rate=args.learning_rate)

    print(f"Model {model.name}: evaluating {len(held_out)} held-out questions at step {model.step}")
    before = await evaluate(model, greedy, held_out, judge, usage)
    print(f"  held-out RULER score {before.metrics['reward']:.3f}")
    tied = submitted = 0.0
    for batch in art.iterate_dataset(
        train_questions,
        args.groups_per_step,
        num_epochs=100,
        initial_step=model.step,
        use_tqdm=False,
    ):
        if batch.step >= args.steps:
            break
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(
                    rollout(model, sampled, q) for _ in range(args.rollouts_per_group)
                )
                for q in batch.items
            ),
            pbar_desc=f"step {batch.step + 1}/{args.steps}",
            max_exceptions=0.1,
            after_each=score_group,
        )
        result = await model.train(groups, config=config)
        m = result.metrics
        tied += m.get("groups/zero_variance", 0)
        submitted += m.get("groups/submitted", 0)
        print(
            f"  step {batch.step + 1}: judged reward {m.get('reward', 0):.3f}  states the fact "
            f"{mean_metric(groups, 'states_fact'):.2f}  trainable groups "
            f"{m.get('groups/trainable', 0):.0f}/{m.get('groups/submitted', 0):.0f}  tied "
            f"{m.get('groups/zero_variance', 0):.0f}  dropped by the judge "
            f"{m.get('groups/dropped_before_training', 0):.0f}  "
            f"{m.get('step_seconds', 0):.1f}s train"
        )

    after = await evaluate(model, greedy, held_out, judge, usage)
    history = await backend.history(model)
    minutes = (time.monotonic() - started) / 60
    judge_name = judge if isinstance(judge, str) else judge.get_inference_name()
    folder = Path(args.path) / "langgraph" / "models" / model.name / "report"
    report = write_report(
        folder,
        title="A LangGraph planner + branches + subgraph graph trained with RULER rewards",
        description=(
            f"SmolLM2-135M-Instruct answers bike-shop customers through a planner, two parallel "
            f"drafting branches and a writer subgraph; RULER ({judge_name} as judge) scores each "
            f"group of {args.rollouts_per_group} runs; GRPO on a LoRA adapter, {args.steps} steps "
            f"of {args.groups_per_step} questions, CPU only, {minutes:.1f} minutes in all. "
            "Held-out reward: the judge's score of each greedy run alone; states_fact: a code "
            "check the judge never sees. A 135M judge is weak: its scores are noisy and often tied."
        ),
        before=before,
        after=after,
        history=history,
        settings={**vars(args), "judge": judge_name, "minutes": round(minutes, 1)},
    )
    print_summary(before, after, report)
    print(f"\nJudge {judge_name}: {usage.summary()}")
    if submitted and tied / submitted > 0.5:
        print(
            f"The judge gave every run the same score in {tied:.0f} of {submitted:.0f} groups: "
            "GRPO learns nothing from a tied group. A 135M judge is weak; use a stronger one "
            "(--judge provider/model)."
        )
    print(f"Total {minutes:.1f} min")
    await backend.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--judge", default=None, help="'<provider>/<model>' (default: the base model)"
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    # four calls in a row compound a small model's sampling noise: 1.0 gives gibberish replies
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=64, help="the writer's; others half")
    parser.add_argument("--eval-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", default=".art")
    parser.add_argument("--name", default=None, help="model name (default: a new one per run)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
