"""A bf16 model's logits are computed in float32 (`_float32_logits`): the LM head's output is not
rounded to bf16, so the sampler's and the trainer's logprobs of the same tokens do not carry
bf16's rounding of their logits."""

from __future__ import annotations

from pathlib import Path

import torch

from art_backend.engines._loading import load_model


def test_a_bf16_model_answers_its_lm_heads_product_in_float32(tiny_model_dir: Path) -> None:
    model = load_model(str(tiny_model_dir), dtype="bfloat16").model
    ids = torch.tensor([[5, 17, 230, 41, 99, 8]])
    with torch.no_grad():
        output = model(input_ids=ids, output_hidden_states=True)
    hidden = output.hidden_states[-1]
    assert hidden.dtype == torch.bfloat16 and output.logits.dtype == torch.float32
    weight = model.get_output_embeddings().weight
    exact = hidden.double() @ weight.double().T
    assert torch.allclose(output.logits.double(), exact, atol=1e-5)


def test_gradients_flow_through_the_float32_head_in_the_models_dtype(
    tiny_model_dir: Path,
) -> None:
    model = load_model(str(tiny_model_dir), dtype="bfloat16").model
    embeddings = model.get_input_embeddings()
    embeddings.weight.requires_grad_(True)
    logits = model(input_ids=torch.tensor([[5, 17, 230]])).logits
    assert logits.dtype == torch.float32
    torch.log_softmax(logits, dim=-1)[0, -1, 7].backward()
    assert embeddings.weight.grad is not None and embeddings.weight.grad.dtype == torch.bfloat16
    assert torch.isfinite(embeddings.weight.grad.float()).all()


def test_a_head_first_used_for_inference_still_trains(tiny_model_dir: Path) -> None:
    """The engine's forward runs in inference mode; the float32 copy it makes must still serve
    the trainer's backward after it (an inference tensor cannot be saved for backward)."""
    model = load_model(str(tiny_model_dir), dtype="bfloat16").model
    ids = torch.tensor([[5, 17, 230]])
    with torch.inference_mode():
        model(input_ids=ids)
    embeddings = model.get_input_embeddings()
    embeddings.weight.requires_grad_(True)
    torch.log_softmax(model(input_ids=ids).logits, dim=-1)[0, -1, 7].backward()
    assert embeddings.weight.grad is not None
