"""LangChain's standard test suites for chat models, run on TrainableChatModel.

Unit tests need no server. Integration tests run against the real server on 127.0.0.1 with the
tiny random model: everything about the protocol is tested; tests that judge what a model says
(the right tool with the right arguments, a sensible answer) cannot pass on a random model and
are marked xfail(strict) below, each with its reason.

Skipped by the suite itself, on this class's declared capabilities: image, PDF and audio inputs
(the server takes text), Anthropic-format inputs, the VCR-recorded benchmark, init from
environment variables, serialization (`is_lc_serializable` is False: the model wraps a live
backend), and `model_override_value` (the served name always follows the art model's step).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

import art_core as art
from art_langgraph import TrainableChatModel


class TestTrainableChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[TrainableChatModel]:
        return TrainableChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"art_model": art.Model(name="tiny", base_url="http://127.0.0.1:9/v1", api_key="k")}


class TestTrainableChatModelIntegration(ChatModelIntegrationTests):
    url: ClassVar[str] = ""

    @pytest.fixture(autouse=True)
    def _server(self, training_server: Any) -> None:
        type(self).url = training_server.url

    @property
    def chat_model_class(self) -> type[TrainableChatModel]:
        return TrainableChatModel

    @property
    def supports_json_mode(self) -> bool:
        return True  # response_format json_object, enforced by constrained decoding

    @property
    def chat_model_params(self) -> dict[str, Any]:
        model = art.Model(name="tiny", base_url=f"{self.url}/v1", api_key="unused")
        return {"art_model": model, "max_tokens": 256, "temperature": 0.0}

    # Expected to fail (strict: a pass would fail the run): each checks what a model chooses to
    # say, which a random model cannot do. The protocol side of each (forced tool calls parsed
    # into tool_calls, schema-valid arguments, tool messages accepted back) is exercised by the
    # suite's other tests, which pass. The suite requires xfail, not skip, for overrides.
    _RANDOM_MODEL = (
        "judges the model's choice, not the protocol: asserts the argument value the prompt "
        "asks for (e.g. input=3); the tiny random model writes a schema-valid arbitrary value"
    )

    @pytest.mark.xfail(reason=_RANDOM_MODEL, strict=True)
    def test_tool_calling(self, model: BaseChatModel) -> None:
        super().test_tool_calling(model)

    @pytest.mark.xfail(reason=_RANDOM_MODEL, strict=True)
    async def test_tool_calling_async(self, model: BaseChatModel) -> None:
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(
        strict=True,
        reason="asserts the agent's final answer mentions the tool's result (weather words); "
        "a random model's answer does not",
    )
    def test_agent_loop(self, model: BaseChatModel) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(
        strict=True,
        reason="asserts the Chinese text the prompt asks for appears in the tool arguments; a "
        "random model writes other characters (unicode round-trip through the server is "
        "covered by the server tests)",
    )
    def test_unicode_tool_call_integration(
        self,
        model: BaseChatModel,
        *,
        tool_choice: str | None = None,
        force_tool_call: bool = True,
    ) -> None:
        super().test_unicode_tool_call_integration(
            model, tool_choice=tool_choice, force_tool_call=force_tool_call
        )

    @pytest.mark.xfail(
        strict=True,
        reason="json_object mode guarantees a JSON object (enforced here); the test needs the "
        "model to fill the fields the prompt describes, which a random model writes as {}",
    )
    def test_json_mode(self, model: BaseChatModel) -> None:
        super().test_json_mode(model)
