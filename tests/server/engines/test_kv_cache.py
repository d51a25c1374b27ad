"""The growing KV layer behaves exactly like transformers' DynamicLayer, without the copies; the
cache reaches the model under the keyword the installed transformers names."""

from __future__ import annotations

import inspect
import warnings

import torch
from transformers.cache_utils import DynamicLayer

from art_backend.engines._kv_cache import ROOM, GrowingLayer, cache_keyword


def states(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, 2, length, 4)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def test_appends_past_its_room_match_dynamic_layer():
    reference = DynamicLayer()
    reference.update(*states(3, 5, seed=0))
    growing = GrowingLayer.from_layer(reference)
    for step in range(ROOM * 2 + 3):
        expected = reference.update(*states(3, 1, seed=step + 1))
        got = growing.update(*states(3, 1, seed=step + 1))
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert growing.get_seq_length() == reference.get_seq_length() == 5 + ROOM * 2 + 3


def test_appending_writes_in_place_while_there_is_room():
    reference = DynamicLayer()
    reference.update(*states(2, 4, seed=0))
    growing = GrowingLayer.from_layer(reference)
    buffer_before = growing._key_buffer
    growing.update(*states(2, 1, seed=1))
    assert growing._key_buffer is buffer_before


def test_batch_selection_and_reassignment_keep_keys_and_values_apart():
    reference = DynamicLayer()
    reference.update(*states(4, 6, seed=0))
    growing = GrowingLayer.from_layer(reference)
    keep = torch.tensor([3, 1])
    reference.batch_select_indices(keep)
    growing.batch_select_indices(keep)
    assert torch.equal(growing.keys, reference.keys)
    assert torch.equal(growing.values, reference.values)
    # Replacing keys first (longer) must not change what values reads.
    values_before = growing.values.clone()
    growing.keys = torch.cat([growing.keys, growing.keys], dim=2)
    assert torch.equal(growing.values, values_before)


def test_the_cache_goes_under_the_keyword_the_installed_transformers_names(tiny_model_dir):
    """transformers 5.24 renamed `past_key_values` to `cache` (the old name warns per call)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    keyword = cache_keyword(model)
    assert keyword in inspect.signature(model.forward).parameters
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert cache_keyword(wrapped) == keyword  # read through PEFT's **kwargs forward
    cache = DynamicCache(config=model.config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation warning on the decode path
        with torch.no_grad():
            wrapped(torch.tensor([[1, 2, 3]]), **{keyword: cache}, use_cache=True)
    assert cache.get_seq_length() == 3  # the forward filled the cache we gave it


def test_a_forward_that_names_neither_keyword_gets_the_one_every_release_accepts():
    class Patched(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, **kwargs: object) -> None: ...

    assert cache_keyword(Patched()) == "past_key_values"
