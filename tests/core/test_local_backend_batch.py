"""LocalBackend's engine batch: the server's own default unless the user or ART's config sets one.

LocalBackend once passed `--max-batch-size 32` to every server it started while `art-server`
defaulted to 128, so a GRPO step of 64 rollouts decoded in two waves of 32 (the demo's
sampling 3.5 s a step instead of 2.8 s, SmolLM2 on 2 cores). These start the real child
process on the tiny model and read the batch the engine actually decoded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import art_core as art
from tests.support.models import fresh_model
from tests.support.servers import read_metrics

pytestmark = pytest.mark.torch_engine  # reads the torch engine's batch counter

ROWS_PER_REQUEST = 24  # two requests: 48 rows, over the old 32 and under the server's 128


async def widest_batch(
    backend: art.LocalBackend, model: art.TrainableModel, tiny_model_dir: Path
) -> float:
    """Two concurrent requests of 24 choices each, run to max_tokens; the widest decode batch."""
    from transformers import AutoTokenizer  # the client-side tests import no torch at collection

    eos = AutoTokenizer.from_pretrained(tiny_model_dir).eos_token_id
    await asyncio.gather(
        *(
            model.openai_client().chat.completions.create(
                model=model.get_inference_name(),
                messages=[{"role": "user", "content": f"Say {i}."}],
                n=ROWS_PER_REQUEST,
                max_tokens=48,
                temperature=1.0,
                logit_bias={str(eos): -100},  # every choice decodes all 48 tokens
            )
            for i in range(2)
        )
    )
    headers = {"Authorization": f"Bearer {backend._api_key}"}
    return read_metrics(backend.base_url, headers)["art_batch_size_max"]


async def test_a_default_local_backend_decodes_both_requests_in_one_batch(
    tiny_model_dir: Path, tmp_path: Path
):
    backend = art.LocalBackend(path=tmp_path, dtype="float32")
    try:
        model = await fresh_model(backend, tiny_model_dir)
        assert await widest_batch(backend, model, tiny_model_dir) == 2 * ROWS_PER_REQUEST
    finally:
        await backend.close()


async def test_max_batch_size_from_the_user_or_arts_engine_args_bounds_the_batch(
    tiny_model_dir: Path, tmp_path: Path
):
    backend = art.LocalBackend(path=tmp_path / "user", dtype="float32", max_batch_size=30)
    try:
        model = await fresh_model(backend, tiny_model_dir)
        assert (
            await widest_batch(backend, model, tiny_model_dir) == ROWS_PER_REQUEST
        )  # the second one waits
    finally:
        await backend.close()

    backend = art.LocalBackend(path=tmp_path / "art", dtype="float32")
    try:
        model = await fresh_model(
            backend,
            tiny_model_dir,
            _internal_config=art.dev.InternalModelConfig(
                engine_args=art.dev.EngineArgs(max_num_seqs=30)
            ),
        )
        assert await widest_batch(backend, model, tiny_model_dir) == ROWS_PER_REQUEST
    finally:
        await backend.close()
