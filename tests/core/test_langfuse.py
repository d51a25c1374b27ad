"""Langfuse export against a loopback Langfuse that decodes what goes over the wire.

Real trajectories come from the tiny model on the real server (Choices with completion ids,
so the export reads their records); the receiver decodes the OTLP protobuf and the scores.
Failures (a wrong key, Langfuse down, a full queue) must leave training untouched.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import art_core as art
from art_core.trackers.langfuse import LangfuseObserver
from art_core.trackers.langfuse._default_exporter import reset_default_exporter
from art_core.trackers.langfuse._trace import trace_id_for
from tests.support.langfuse_receiver import (
    PUBLIC_KEY,
    SECRET_KEY,
    LangfuseReceiver,
    exporter,
    langfuse_receiver,
    langfuse_receiver_server,
)
from tests.support.models import fresh_model
from tests.support.rollouts import groups_for, varied_group

__all__ = ["exporter", "langfuse_receiver", "langfuse_receiver_server"]

QUESTIONS = ["What is 2 + 2?", "Name a colour."]


@pytest.fixture
async def model(remote_backend: art.RemoteBackend, tiny_model_dir: Path) -> art.TrainableModel:
    return await fresh_model(remote_backend, tiny_model_dir)


def records_of(model: art.TrainableModel, groups: list[art.TrajectoryGroup]) -> dict[str, dict]:
    ids = [
        item.model_extra["completion_id"]
        for group in groups
        for trajectory in group
        for item in trajectory.messages_and_choices
        if not isinstance(item, dict)
    ]
    url = f"{model.backend.inference_base_url}/chat/completions/lookup"
    return {r["id"]: r for r in httpx.post(url, json={"ids": ids}).json()["data"]}


async def test_a_training_step_exports_each_trajectory_as_a_trace_of_its_calls(
    model: art.TrainableModel, exporter: art.LangfuseExporter, langfuse_receiver: LangfuseReceiver
):
    groups = varied_group(await groups_for(model, QUESTIONS, per_group=2))
    records = records_of(model, groups)
    model.observers = [LangfuseObserver(exporter)]
    result = await model.train(groups)
    assert exporter.flush(timeout=30)

    traces = langfuse_receiver.traces()
    trajectories = [t for group in groups for t in group]
    assert len(traces) == len(trajectories) == 4
    for group_index, group in enumerate(groups):
        for trajectory in group:
            trace_id = trace_id_for(trajectory.id)
            root, generation = traces[trace_id]
            assert trajectory.metadata["langfuse_trace_url"] == (
                f"{langfuse_receiver.url}/trace/{trace_id}"
            )
            # The tree: the run, and its one call under it.
            assert root.parent_span_id is None and root.type == "span"
            assert root.attributes["langfuse.internal.is_app_root"] is True
            assert generation.parent_span_id == root.span_id and generation.type == "generation"
            # The call, from its record on the server.
            choice = trajectory.messages_and_choices[-1]
            record = records[choice.model_extra["completion_id"]]
            assert generation.attributes["langfuse.observation.model.name"] == f"{model.name}@0"
            assert generation.attribute_json("langfuse.observation.input") == [
                trajectory.messages_and_choices[0]
            ]
            assert generation.attribute_json("langfuse.observation.output")["content"] == (
                choice.message.content
            )
            parameters = generation.attribute_json("langfuse.observation.model.parameters")
            assert (parameters["temperature"], parameters["max_tokens"]) == (1.0, 8)
            assert generation.attribute_json("langfuse.observation.usage_details") == {
                "input": record["usage"]["prompt_tokens"],
                "output": record["usage"]["completion_tokens"],
                "total": record["usage"]["total_tokens"],
            }
            assert generation.start_ns == int(record["started_at"] * 1e9)
            assert generation.end_ns == int(record["recorded_at"] * 1e9)
            assert generation.metadata("completion_id") == record["id"]
            # Trace attributes on every span, as the SDK's propagate_attributes writes them.
            for span in (root, generation):
                assert span.attributes["session.id"] == f"tests/{model.name}"
                assert span.attributes["langfuse.trace.tags"] == ["split:train", "step:0"]
                assert span.trace_metadata("step") == 0
                assert span.trace_metadata("split") == "train"
                assert span.trace_metadata("group") == group_index
                assert span.trace_metadata("advantage") == result.advantages[trajectory.id]
                assert span.scope_name == "langfuse-sdk"
                assert span.scope_attributes == {"public_key": PUBLIC_KEY}
            scores = langfuse_receiver.scores_of(trace_id)
            assert scores["reward"]["value"] == trajectory.reward
            assert scores["reward"]["id"] == f"{trace_id}-reward"
    assert exporter.stats()["exported_traces"] == 4

    # What went over the wire: gzip protobuf with Basic auth and the SDK's headers.
    otlp = [r for r in langfuse_receiver.requests if r.path == "/api/public/otel/v1/traces"]
    headers = {k.lower(): v for k, v in otlp[0].headers.items()}
    assert headers["content-encoding"] == "gzip"
    assert headers["x-langfuse-ingestion-version"] == "4"
    assert headers["x-langfuse-public-key"] == PUBLIC_KEY
    # The next step reports what was exported since the last one.
    next_step = await model.train(varied_group(await groups_for(model, QUESTIONS[:1])))
    assert next_step.metrics["langfuse/exported_traces"] == 4.0


async def test_an_evaluation_logged_with_langfuse_true_is_a_val_trace_without_advantage(
    model: art.TrainableModel, langfuse_receiver: LangfuseReceiver, monkeypatch
):
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PUBLIC_KEY)
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", SECRET_KEY)
    monkeypatch.setenv("LANGFUSE_HOST", langfuse_receiver.url)
    groups = await groups_for(model, QUESTIONS[:1], per_group=1)
    try:
        model.observers = [LangfuseObserver(requested=True)]
        await model.log(groups, split="val")
        assert art.flush_langfuse(timeout=30)
        assert art.langfuse_stats()["exported_traces"] == 1
    finally:
        _close_default_exporter()
    [spans] = langfuse_receiver.traces().values()
    assert spans[0].attributes["langfuse.trace.tags"] == ["split:val", "step:0"]
    assert "langfuse.trace.metadata.advantage" not in spans[0].attributes


async def test_the_environment_variables_alone_turn_export_on_for_train(
    model: art.TrainableModel, langfuse_receiver: LangfuseReceiver, monkeypatch
):
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", PUBLIC_KEY)
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", SECRET_KEY)
    monkeypatch.setenv("LANGFUSE_HOST", langfuse_receiver.url)
    groups = varied_group(await groups_for(model, QUESTIONS[:1], per_group=2))
    try:
        await model.train(groups)
        assert art.flush_langfuse(timeout=30)
    finally:
        _close_default_exporter()
    assert len(langfuse_receiver.traces()) == 2


async def test_a_wrong_key_is_one_counted_warning_and_training_goes_on(
    model: art.TrainableModel, langfuse_receiver: LangfuseReceiver, caplog
):
    wrong = art.LangfuseExporter(
        public_key=PUBLIC_KEY, secret_key="sk-wrong", host=langfuse_receiver.url, timeout=2.0
    )
    caplog.set_level(logging.WARNING)
    model.observers = [LangfuseObserver(wrong)]
    try:
        first = await model.train(varied_group(await groups_for(model, QUESTIONS, per_group=2)))
        assert wrong.flush(timeout=30)
        second = await model.train(
            varied_group(await groups_for(model, QUESTIONS[:1], per_group=2))
        )
        assert wrong.flush(timeout=30)
    finally:
        wrong.close(timeout=5)
    assert (first.step, second.step) == (1, 2)
    assert second.metrics["langfuse/dropped_traces"] == 4.0
    stats = wrong.stats()
    assert (stats["exported_traces"], stats["dropped_traces"]) == (0, 6)
    assert "401" in stats["last_error"]
    assert {r.status for r in langfuse_receiver.requests} == {401}
    assert langfuse_receiver.spans == [] and langfuse_receiver.scores == []
    failures = [r for r in caplog.records if r.name == "art_core.langfuse"]
    assert len(failures) == 1 and "dropped" in failures[0].getMessage()
    # The OTLP exporter's own error lines for our exports are folded into that one warning.
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


async def test_langfuse_down_drops_the_traces_with_a_count_and_training_goes_on(
    model: art.TrainableModel,
):
    with socket.socket() as probe:  # a port nothing listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = art.LangfuseExporter(
        public_key=PUBLIC_KEY, secret_key=SECRET_KEY, host=f"http://127.0.0.1:{port}", timeout=1.0
    )
    model.observers = [LangfuseObserver(down)]
    try:
        result = await model.train(
            varied_group(await groups_for(model, QUESTIONS[:1], per_group=2))
        )
        assert down.flush(timeout=30)
    finally:
        down.close(timeout=5)
    assert result.step == 1 and result.metrics["trained"] == 1.0
    assert down.stats()["dropped_traces"] == 2 and down.stats()["exported_traces"] == 0


async def test_a_503_is_retried_and_the_trace_arrives(
    model: art.TrainableModel, exporter: art.LangfuseExporter, langfuse_receiver: LangfuseReceiver
):
    langfuse_receiver.fail_next.append(503)
    groups = await groups_for(model, QUESTIONS[:1], per_group=1)
    model.observers = [LangfuseObserver(exporter)]
    await model.log(groups)
    assert exporter.flush(timeout=30)
    assert [r.status for r in langfuse_receiver.requests][:2] == [503, 200]
    assert exporter.stats()["exported_traces"] == 1 and len(langfuse_receiver.traces()) == 1


async def test_exporting_the_same_trajectories_again_writes_the_same_ids(
    model: art.TrainableModel, exporter: art.LangfuseExporter, langfuse_receiver: LangfuseReceiver
):
    groups = await groups_for(model, QUESTIONS[:1], per_group=2)
    model.observers = [LangfuseObserver(exporter)]
    await model.log(groups)
    assert exporter.flush(timeout=30)
    first = (
        sorted((s.trace_id, s.span_id) for s in langfuse_receiver.spans),
        sorted(s["id"] for s in langfuse_receiver.scores),
    )
    langfuse_receiver.reset()
    model.observers = [LangfuseObserver(exporter)]
    await model.log(groups)
    assert exporter.flush(timeout=30)
    again = (
        sorted((s.trace_id, s.span_id) for s in langfuse_receiver.spans),
        sorted(s["id"] for s in langfuse_receiver.scores),
    )
    assert first == again and len(first[0]) == 4


def test_a_full_queue_drops_with_a_count_at_once(langfuse_receiver: LangfuseReceiver, caplog):
    small = art.LangfuseExporter(
        public_key=PUBLIC_KEY,
        secret_key=SECRET_KEY,
        host=langfuse_receiver.url,
        max_queued_traces=1,
    )
    unregistered = art.TrainableModel(name="offline", project="tests", base_model="none")
    group = art.TrajectoryGroup([art.Trajectory(reward=1.0), art.Trajectory(reward=0.0)])
    caplog.set_level(logging.WARNING)
    try:
        assert small.export_groups(unregistered, [group], split="val", step=0) is None
        assert small.stats()["dropped_traces"] == 2
        assert small.take_unreported("tests/offline") == {"langfuse/dropped_traces": 2.0}
        assert "queue is full" in caplog.text
    finally:
        small.close(timeout=5)


async def test_langfuse_true_without_keys_is_a_named_error(model: art.TrainableModel, monkeypatch):
    for name in (
        "LANGFUSE_PUBLIC_KEY",
        "LANGFUSE_SECRET_KEY",
        "LANGFUSE_HOST",
        "LANGFUSE_BASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(art.LangfuseConfigError, match="LANGFUSE_PUBLIC_KEY"):
        LangfuseObserver(requested=True)
    with pytest.raises(art.LangfuseConfigError, match="LANGFUSE_HOST"):
        art.LangfuseExporter(public_key="pk", secret_key="sk")


def test_art_core_imports_without_the_langfuse_sdk_and_says_what_to_install():
    code = """
import os, sys
for name in ("langfuse", "opentelemetry"):
    sys.modules[name] = None  # import fails, find_spec says absent: as if not installed
import art_core as art
assert art.langfuse_stats()["exported_traces"] == 0
try:
    art.LangfuseExporter(public_key="pk", secret_key="sk", host="http://x")
except art.LangfuseNotInstalledError as error:
    assert "art-trainer[langfuse]" in str(error)
else:
    raise SystemExit("no LangfuseNotInstalledError")
os.environ.update(LANGFUSE_PUBLIC_KEY="pk", LANGFUSE_SECRET_KEY="sk", LANGFUSE_HOST="http://x")
from art_core.trackers.langfuse._default_exporter import resolve_exporter
assert resolve_exporter(None) is None  # set but not installed: a warning, no export
try:
    resolve_exporter(True)
except art.LangfuseNotInstalledError:
    pass
else:
    raise SystemExit("langfuse=True without the SDK did not raise")
"""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LANGFUSE_")}
    subprocess.run([sys.executable, "-c", code], check=True, env=environment)


def _close_default_exporter() -> None:
    reset_default_exporter()


def test_our_spans_scores_and_headers_match_what_the_langfuse_sdk_itself_sends(
    exporter: art.LangfuseExporter, langfuse_receiver: LangfuseReceiver
):
    """The real SDK (its own tracer, propagate_attributes, create_score) through the receiver,
    side by side with our export of the same shape of run."""
    from langfuse import Langfuse, propagate_attributes
    from openai.types.chat.chat_completion import Choice
    from opentelemetry.sdk.trace import TracerProvider

    sdk = Langfuse(
        public_key=PUBLIC_KEY,
        secret_key=SECRET_KEY,
        base_url=langfuse_receiver.url,
        tracer_provider=TracerProvider(),  # not the process-wide provider
    )
    sdk_trace_id = Langfuse.create_trace_id(seed="sdk-run")
    with (
        sdk.start_as_current_observation(
            name="run", trace_context={"trace_id": sdk_trace_id}, input="hi", metadata={"r": 1}
        ) as run,
        propagate_attributes(
            session_id="tests/sdk", tags=["split:val"], metadata={"step": 0}, trace_name="run"
        ),
    ):
        run.update(output={"role": "assistant", "content": "yo"})
        call = sdk.start_observation(
            name="chat", as_type="generation", input=[{"role": "user", "content": "hi"}]
        )
        call.update(output={"role": "assistant", "content": "yo"}, metadata={"n": 1})
        call.end()
        tool = sdk.start_observation(name="lookup", as_type="tool", input={"city": "Paris"})
        tool.update(output="9-18", metadata={"tool_call_id": "c1"})
        tool.end()
    sdk.create_score(name="reward", value=1.0, trace_id=sdk_trace_id, data_type="NUMERIC")
    sdk.flush()
    sdk.shutdown()

    reply = Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
        }
    )
    ours = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "hi"},
            reply,
            {"role": "tool", "tool_call_id": "c1", "content": "9-18"},
        ],
        reward=1.0,
    )
    offline = art.TrainableModel(name="offline", project="tests", base_model="none")
    exporter.export_groups(offline, [art.TrajectoryGroup([ours])], split="val", step=0)
    assert exporter.flush(timeout=30)

    traces = langfuse_receiver.traces()
    sdk_spans = {span.type: span for span in traces[sdk_trace_id]}
    our_spans = {span.type: span for span in traces[trace_id_for(ours.id)]}

    def keys(span):  # attribute names, metadata keys folded
        return {k.rsplit(".", 1)[0] if ".metadata." in k else k for k in span.attributes}

    for kind in ("span", "generation", "tool"):
        ours_only = keys(our_spans[kind]) - keys(sdk_spans[kind])
        assert ours_only <= {"langfuse.internal.is_app_root"}, (kind, ours_only)
        assert our_spans[kind].scope_name == sdk_spans[kind].scope_name == "langfuse-sdk"
        assert our_spans[kind].scope_version == sdk_spans[kind].scope_version
    # The same encodings: metadata values JSON-encoded, input/output JSON.
    assert sdk_spans["generation"].metadata("n") == 1
    assert sdk_spans["generation"].trace_metadata("step") == our_spans["generation"].trace_metadata(
        "step"
    )
    assert our_spans["tool"].attribute_json("langfuse.observation.input") == (
        sdk_spans["tool"].attribute_json("langfuse.observation.input")
    )
    otlp = [r for r in langfuse_receiver.requests if r.path == "/api/public/otel/v1/traces"]
    header_names = [{k.lower() for k in r.headers} - {"content-length"} for r in otlp]
    assert len(otlp) == 2 and header_names[0] == header_names[1]
    sdk_score = langfuse_receiver.scores_of(sdk_trace_id)["reward"]
    our_score = langfuse_receiver.scores_of(trace_id_for(ours.id))["reward"]
    assert set(our_score) <= set(sdk_score) | {"timestamp"}
