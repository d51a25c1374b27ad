"""The embedded default model loads offline and answers a factual question."""

from __future__ import annotations

import pytest
import torch

from art_backend.testing import load_model

pytestmark = pytest.mark.slow


def test_default_model_loads_offline_and_knows_the_capital_of_france(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model("smollm2-135m-instruct")
    tokenizer = loaded.tokenizer

    assert loaded.context_length == 8192
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in loaded.eos_token_ids
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        output = loaded.model.generate(
            **inputs, max_new_tokens=24, do_sample=False, eos_token_id=loaded.eos_token_ids
        )
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)

    assert "Paris" in answer
