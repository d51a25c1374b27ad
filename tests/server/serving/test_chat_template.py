"""A model without a chat template (a base model): the server says so at start, refuses chat
requests by naming `--chat-template` and `/v1/completions`, and `--chat-template` (a built-in
name or a Jinja file) makes chat work; a template that cannot be used stops the start."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from transformers import AutoTokenizer

import art_core as art
from art_backend._errors import InvalidRequestError
from art_backend._settings import ServerSettings
from art_backend.cli import build_app
from art_backend.engines._chat_templates import BUILTIN_TEMPLATES, install_chat_template
from art_backend.training._rows import sft_sequence
from art_core.errors import BackendWarning
from tests.support.processes import art_server_refusal
from tests.support.servers import RunningServer, running_server
from tests.support.tiny_model import build_tiny_model

HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a base model: no chat template (its vocabulary has the ChatML tokens)."""
    return build_tiny_model(tmp_path_factory.mktemp("base-model"), chat_template=False)


@dataclass
class StartedServer:
    running: RunningServer
    warnings: list[str]  # what art_backend.cli warned while the server started


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def base_server(
    base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartedServer]:
    """The base model served as it is, and the warnings its start logged."""
    collect, logger = _Collect(), logging.getLogger("art_backend.cli")
    logger.addHandler(collect)
    try:
        with running_server(base_model_dir, tmp_path_factory.mktemp("art-base")) as running:
            logger.removeHandler(collect)
            yield StartedServer(running, collect.messages)
    finally:
        logger.removeHandler(collect)


def no_template_hint(message: str) -> bool:
    return "--chat-template" in message and "/v1/completions" in message


# ----------------------------------------------------------------------- without a template


def test_the_start_warns_and_the_model_list_shows_it(base_server: StartedServer):
    assert any(no_template_hint(message) for message in base_server.warnings)
    models = httpx.get(f"{base_server.running.url}/v1/models").json()["data"]
    assert [model["chat_template"] for model in models] == [False]


def test_chat_completions_are_refused_naming_the_option_and_the_route(
    base_server: StartedServer,
):
    client = openai.OpenAI(
        base_url=f"{base_server.running.url}/v1", api_key="unused", max_retries=0
    )
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="tiny", messages=HELLO, stream=stream)  # type: ignore[call-overload]
        body = refused.value.body
        assert no_template_hint(body["message"]), body
        assert body["param"] == "messages" and body["code"] == "no_chat_template"
        assert "Cannot use chat template functions" not in body["message"]  # not the raw error
    # Plain text is served.
    completion = client.completions.create(model="tiny", prompt="Question: 1 + 1?", max_tokens=3)
    assert completion.choices[0].finish_reason in ("stop", "length")


def test_responses_are_refused_the_same_way(base_server: StartedServer):
    client = openai.OpenAI(
        base_url=f"{base_server.running.url}/v1", api_key="unused", max_retries=0
    )
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input="hi")
    assert no_template_hint(refused.value.body["message"])
    assert refused.value.body["param"] == "input"


def test_messages_and_their_token_count_are_refused_in_anthropics_shape(
    base_server: StartedServer,
):
    client = anthropic.Anthropic(base_url=base_server.running.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="tiny", max_tokens=8, messages=HELLO)  # type: ignore[arg-type]
    assert no_template_hint(refused.value.message)
    with pytest.raises(anthropic.BadRequestError) as counted:
        client.messages.count_tokens(model="tiny", messages=HELLO)  # type: ignore[arg-type]
    assert no_template_hint(counted.value.message)


def test_sft_on_a_model_without_a_template_says_which_option_to_use(base_model_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    conversation = [*HELLO, {"role": "assistant", "content": "hello"}]
    with pytest.raises(ValueError, match="start art-server with --chat-template"):
        sft_sequence(tokenizer, conversation)


# ------------------------------------------------------------------------- --chat-template


def test_the_chatml_built_in_makes_chat_work(base_model_dir: Path, tmp_path: Path):
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    with running_server(base_model_dir, tmp_path, chat_template="chatml") as running:
        models = httpx.get(f"{running.url}/v1/models").json()["data"]
        assert [model["chat_template"] for model in models] == [True]
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        response = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3)  # type: ignore[arg-type]
    rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    expected = tokenizer.encode(rendered, add_special_tokens=False)
    assert (response.model_extra or {})["prompt_token_ids"] == expected


def test_a_jinja_file_overrides_the_tokenizers_own_template(tiny_model_dir: Path, tmp_path: Path):
    template = tmp_path / "plain.jinja"
    template.write_text(
        "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with running_server(tiny_model_dir, tmp_path / "art", chat_template=str(template)) as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        response = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3)  # type: ignore[arg-type]
    expected = tokenizer.encode("user: hi\nassistant:", add_special_tokens=False)
    assert (response.model_extra or {})["prompt_token_ids"] == expected


def test_a_built_in_ends_a_turn_with_its_own_token(base_model_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    stops = install_chat_template(tokenizer, BUILTIN_TEMPLATES["chatml"])
    assert stops == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert tokenizer.chat_template == BUILTIN_TEMPLATES["chatml"].text


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("gemma", "lacks <start_of_turn>, <end_of_turn> as single tokens"),
        ("llama3", "Built-in templates that fit this vocabulary: chatml"),
    ],
)
def test_a_built_in_whose_tokens_the_vocabulary_lacks_is_refused(
    base_model_dir: Path, template: str, words: str
):
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    with pytest.raises(InvalidRequestError) as refused:
        install_chat_template(tokenizer, BUILTIN_TEMPLATES[template])
    assert words in refused.value.message
    assert tokenizer.chat_template is None  # left as it was


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "no such file"),
        ("", "the file is empty"),
        ("{% for message in messages %}", "not a valid Jinja template (line 1"),
        (b"\xff\xfe{{ x }}", "cannot be read as UTF-8"),
        ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    ],
)
def test_a_template_file_that_cannot_be_used_stops_the_start(
    base_model_dir: Path, tmp_path: Path, content: str | bytes | None, words: str
):
    path = tmp_path / "template.jinja"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(InvalidRequestError) as refused:
        build_app(
            ServerSettings(str(base_model_dir), art_path=tmp_path / "art", chat_template=str(path))
        )
    assert words in refused.value.message and "--chat-template" in refused.value.message


def test_art_server_refuses_an_unknown_name_before_loading_the_model(tmp_path: Path):
    # The model does not exist either: the template is checked first, so its error is shown.
    refusal = art_server_refusal(
        "--model", str(tmp_path / "missing"), "--chat-template", "chatml2", timeout=60
    )
    assert "--chat-template 'chatml2': not a built-in template (chatml, gemma, llama3)" in refusal


# -------------------------------------------------------------------------------- LocalBackend


async def test_local_backend_passes_the_template_to_its_server(
    base_model_dir: Path, tmp_path: Path
):
    backend = art.LocalBackend(path=tmp_path, dtype="float32", chat_template="chatml")
    try:
        model = art.TrainableModel(name="chatty", project="tests", base_model=str(base_model_dir))
        with warnings.catch_warnings():
            warnings.simplefilter("error", BackendWarning)  # no "no chat template" warning
            await model.register(backend)
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=HELLO,
            max_tokens=2,  # type: ignore[arg-type]
        )
        assert response.choices[0].message.role == "assistant"
    finally:
        await backend.close()
