"""Unsloth as the GPU trainer: refused with a clear message where it cannot run, never imported
on CPU, and on a CUDA machine with the extra one GRPO step that writes our usual PEFT folder.

Unsloth patches transformers and PEFT classes for the whole process, so the GPU step runs in a
child process (`one_unsloth_step`); this process keeps plain transformers and checks the
checkpoint and the logprobs against it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from art_backend.testing import BackendError, ModelLoadError
from art_backend.training import _unsloth
from art_backend.training._unsloth import (
    UnslothUnavailableError,
    check_unsloth_available,
    load_unsloth_model,
)

ROOT = Path(__file__).resolve().parents[3]
LORA = {
    "r": 8,
    "alpha": 16,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
}
ADVANTAGES = [1.0, -1.0, 1.0, -1.0]
needs_unsloth_on_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("unsloth") is None,
    reason="Unsloth needs a CUDA GPU and the [unsloth] extra (pip install 'art-trainer[unsloth]' "
    "on a CUDA machine); this machine lacks one of them",
)


def without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def with_cuda(monkeypatch: pytest.MonkeyPatch, *, unsloth_installed: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> ModuleSpec | None:
        if name == "unsloth":
            return ModuleSpec("unsloth", None) if unsloth_installed else None
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(_unsloth.importlib.util, "find_spec", find_spec)


# --- refused where it cannot run ------------------------------------------------------------


def test_without_cuda_the_check_says_to_leave_the_trainer_at_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without_cuda(monkeypatch)
    with pytest.raises(UnslothUnavailableError) as refused:
        check_unsloth_available()
    message = str(refused.value)
    assert "Unsloth trains on CUDA GPUs only; this machine has no CUDA device" in message
    assert "leave --trainer at its default (torch)" in message


def test_with_cuda_but_without_the_package_the_check_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_cuda(monkeypatch, unsloth_installed=False)
    with pytest.raises(UnslothUnavailableError) as refused:
        check_unsloth_available()
    assert "pip install 'art-trainer[unsloth]' on a CUDA machine" in str(refused.value)


def test_with_cuda_and_the_package_the_check_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    with_cuda(monkeypatch, unsloth_installed=True)
    check_unsloth_available()


def test_the_refusal_is_a_backend_error_so_art_server_exits_with_its_message() -> None:
    # art-server turns a BackendError raised while building the app into exit 2 + the message.
    assert issubclass(UnslothUnavailableError, BackendError)


def test_loading_without_cuda_refuses_before_importing_unsloth(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    without_cuda(monkeypatch)
    with pytest.raises(UnslothUnavailableError):
        load_unsloth_model(tiny_model_dir, dtype=torch.bfloat16, max_seq_length=2048)
    assert "unsloth" not in sys.modules


class FakeFastLanguageModel:
    """Stands in for unsloth.FastLanguageModel: records the call, or fails as Unsloth would."""

    calls: ClassVar[list[dict[str, Any]]] = []
    error: ClassVar[Exception | None] = None

    @classmethod
    def from_pretrained(cls, **kwargs: Any) -> tuple[Any, Any]:
        cls.calls.append(kwargs)
        if cls.error is not None:
            raise cls.error
        return torch.nn.Linear(2, 2).train(), "the tokenizer"


@pytest.fixture
def fake_unsloth(monkeypatch: pytest.MonkeyPatch) -> type[FakeFastLanguageModel]:
    with_cuda(monkeypatch, unsloth_installed=True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("UNSLOTH_DISABLE_STATISTICS", raising=False)
    monkeypatch.setitem(
        sys.modules, "unsloth", SimpleNamespace(FastLanguageModel=FakeFastLanguageModel)
    )
    FakeFastLanguageModel.calls, FakeFastLanguageModel.error = [], None
    return FakeFastLanguageModel


def test_loading_asks_unsloth_for_a_16_bit_model_on_this_gpu_with_the_tokenizer_untouched(
    fake_unsloth: type[FakeFastLanguageModel],
) -> None:
    model, tokenizer = load_unsloth_model("/models/m", dtype=torch.bfloat16, max_seq_length=4096)

    assert not model.training and tokenizer == "the tokenizer"
    [call] = fake_unsloth.calls
    assert call["model_name"] == "/models/m"
    assert call["max_seq_length"] == 4096 and call["dtype"] is torch.bfloat16
    assert call["load_in_4bit"] is False and call["load_in_8bit"] is False
    assert call["device_map"] == {"": 0}
    assert call["fix_tokenizer"] is False
    assert call["use_gradient_checkpointing"] is False
    assert os.environ["UNSLOTH_DISABLE_STATISTICS"] == "1"  # no call home at load time


def test_a_model_unsloth_cannot_load_is_a_model_load_error_that_names_it(
    fake_unsloth: type[FakeFastLanguageModel],
) -> None:
    fake_unsloth.error = ValueError("Unsloth: mamba is not supported yet")
    with pytest.raises(ModelLoadError) as refused:
        load_unsloth_model("/models/m", dtype=torch.bfloat16, max_seq_length=4096)
    assert "'/models/m'" in str(refused.value)
    assert "mamba is not supported yet" in str(refused.value)
    assert "--trainer at its default (torch)" in str(refused.value)


def test_importing_the_module_imports_no_unsloth() -> None:
    # A fresh interpreter: this one may have imported anything by now.
    code = (
        "import sys, art_backend.training._unsloth; "
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('unsloth', 'unsloth_zoo')); "
        "assert not leaked, leaked"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# --- one step on a GPU ----------------------------------------------------------------------


def step_rows(tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """Four (prompt ids, completion ids) pairs rendered with the model's own chat template."""
    pairs = []
    for number in range(len(ADVANTAGES)):
        messages = [{"role": "user", "content": f"What is {number} + 7?"}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer.encode(text, add_special_tokens=False)
        answer = tokenizer.encode(f"{number} + 7 = {number + 7}", add_special_tokens=False)
        pairs.append((prompt, [*answer, tokenizer.eos_token_id]))
    return pairs


@torch.no_grad()
def completion_logprobs(model: Any, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """log p of each completion token given what precedes it, one forward per pair."""
    from art_backend.training._logprobs import token_logprobs

    device = next(model.parameters()).device
    result = []
    for prompt, completion in pairs:
        ids = torch.tensor([prompt + completion])
        logits = model(input_ids=ids.to(device), use_cache=False).logits.float().cpu()
        result.append(token_logprobs(logits, ids)[0, len(prompt) :].tolist())
    return result


def one_unsloth_step(model_dir: str, checkpoint_dir: str) -> dict[str, Any]:
    """In a child process: load through Unsloth, take one GRPO step, save the checkpoint."""
    from art_backend.testing import (
        LoraTrainer,
        OptimizerSettings,
        Sequence,
        TorchEngine,
        loss_preset,
        pack_rows,
    )

    model, tokenizer = load_unsloth_model(model_dir, dtype=torch.bfloat16, max_seq_length=2048)
    pairs = step_rows(tokenizer)
    old = completion_logprobs(model, pairs)
    sequences = [
        Sequence(
            input_ids=torch.tensor(prompt + completion),
            trained_mask=torch.tensor([False] * len(prompt) + [True] * len(completion)),
            old_logprobs=torch.tensor([0.0] * len(prompt) + logprobs),
            advantage=advantage,
            trajectory_id=f"t{index}",
            group_id=0,
            truncated=False,
        )
        for index, ((prompt, completion), logprobs, advantage) in enumerate(
            zip(pairs, old, ADVANTAGES, strict=True)
        )
    ]
    rows, _ = pack_rows(sequences, max_length=2048, mask_truncated=False)
    # The trainer's host only: the engine is never started, so nothing decodes on this model.
    engine = TorchEngine(
        model, tokenizer, eos_token_ids=[tokenizer.eos_token_id], context_length=2048
    )
    trainer = LoraTrainer(engine, "train_0", LORA, seed=0)
    # LoRA's B starts at zero, so the first step's gradient reaches B only (A's is B^T times ...).
    lora_b = {
        name: param
        for name, param in engine.model.named_parameters()
        if ".train_0." in name and "lora_B" in name
    }
    before = {name: param.detach().clone() for name, param in lora_b.items()}
    metrics = trainer.grpo_step(
        rows, loss_preset("grpo"), OptimizerSettings(learning_rate=1e-3), beta=0.0
    )
    changed = sum(not torch.equal(before[name], param.detach()) for name, param in lora_b.items())
    trainer.save(Path(checkpoint_dir))
    return {
        "metrics": metrics,
        "changed_lora_b": changed,
        "lora_b": len(lora_b),
        "old_logprobs": old,
        "patched_forward": type(engine.model.get_base_model()).forward.__module__,
    }


@needs_unsloth_on_cuda
def test_one_grpo_step_through_unsloth_writes_a_plain_peft_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from art_backend.engines._adapter_files import adaptable_modules, check_adapter_folder

    code = (
        "import json, sys; "
        "from tests.server.training.test_unsloth import one_unsloth_step; "
        "print(json.dumps(one_unsloth_step(sys.argv[1], sys.argv[2])))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(tiny_model_dir), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])

    # The step ran through Unsloth's forward and moved every LoRA B matrix.
    assert report["patched_forward"].startswith("unsloth"), report["patched_forward"]
    metrics = report["metrics"]
    assert all(math.isfinite(value) for value in metrics.values()), metrics
    assert metrics["trained_tokens"] > 0
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=0.02)  # on-policy: new == old
    assert report["changed_lora_b"] == report["lora_b"] > 0

    # The checkpoint is our usual PEFT folder: plain transformers + PEFT load it, key for key.
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).cuda()
    check_adapter_folder(tmp_path, adaptable_modules(plain))
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    peft_model = PeftModel.from_pretrained(plain, str(tmp_path))
    loaded = {
        name.replace(".default", ""): param
        for name, param in peft_model.named_parameters()
        if "lora_" in name
    }
    assert len(loaded) == len(saved)
    for name, tensor in saved.items():
        torch.testing.assert_close(loaded[name].detach().cpu().to(tensor.dtype), tensor)

    # Unsloth's kernels score the tokens as plain transformers does (within bf16 rounding), so
    # the importance ratios against a sampler's logprobs stay near 1.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).cuda()
    reference = completion_logprobs(base.eval(), step_rows(tokenizer))
    differences = [
        abs(ours - theirs)
        for row_ours, row_theirs in zip(report["old_logprobs"], reference, strict=True)
        for ours, theirs in zip(row_ours, row_theirs, strict=True)
    ]
    assert sum(differences) / len(differences) < 0.05, differences
