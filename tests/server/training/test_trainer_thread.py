"""Training's work runs one call at a time, each on a thread that is gone afterwards, and a
step's model work on the torch engine's own thread on a CPU.

A second long-lived thread with torch work keeps a second OpenMP worker pool, which turns every
OpenMP wait in the process from spinning to sleeping (_trainer_thread.py, _loop_calls.py).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from art_backend.training._trainer_thread import TrainerThread


def test_each_call_runs_on_its_own_thread_which_has_exited_when_the_call_returns():
    runner = TrainerThread()

    async def main() -> list[threading.Thread]:
        return [await runner.run(threading.current_thread) for _ in range(3)]

    threads = asyncio.run(main())
    assert len({id(thread) for thread in threads}) == 3
    assert all(thread is not threading.main_thread() for thread in threads)
    for thread in threads:
        thread.join(5)
        assert not thread.is_alive()


def test_calls_are_serialised_and_errors_reach_the_caller():
    runner = TrainerThread()
    running = 0
    most = 0

    def work(value: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        time.sleep(0.05)
        running -= 1
        return value * 2

    def fail() -> None:
        raise ValueError("bad rows")

    async def main() -> list[int]:
        results = await asyncio.gather(*(runner.run(work, n) for n in range(4)))
        with pytest.raises(ValueError, match="bad rows"):
            await runner.run(fail)
        return list(results)

    assert asyncio.run(main()) == [0, 2, 4, 6]
    assert most == 1


def test_model_work_runs_on_the_engine_thread_between_decode_steps(tiny_model_dir):
    """On a CPU a step's model work runs on the torch engine's own thread (one OpenMP pool in
    the process: `engines/_loop_calls.py`), with gradients on, its errors reaching the caller,
    while requests keep being served around it; a stopped engine's calls get a thread of their
    own again."""
    import torch
    from transformers import AutoTokenizer

    from art_backend.engines._engine import GenerationRequest, SamplingParams
    from art_backend.engines._loading import load_model
    from art_backend.testing import TorchEngine

    loaded = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = TorchEngine(loaded.model, tokenizer, eos_token_ids=[], context_length=512)
    runner = TrainerThread(host=engine)

    def where() -> tuple[str, bool]:
        with engine.exclusive():
            weight = torch.ones(3, requires_grad=True)
            (weight * 2).sum().backward()
            return threading.current_thread().name, weight.grad is not None

    def fail() -> None:
        raise ValueError("bad rows")

    async def tokens() -> int:
        request = GenerationRequest(
            prompt_ids=[5, 6, 7], params=SamplingParams(max_new_tokens=6, temperature=0.0)
        )
        events = engine.submit(request)
        count = 0
        while True:
            event = await events.get()
            if not hasattr(event, "token_id"):
                return count
            count += 1

    async def main() -> tuple[list, int, list]:
        served = asyncio.create_task(tokens())
        on_engine = await asyncio.gather(*(runner.run_on_model(where) for _ in range(3)))
        with pytest.raises(ValueError, match="bad rows"):
            await runner.run_on_model(fail)
        elsewhere = [await runner.run(where)]
        return on_engine, await served, elsewhere

    engine.start()
    try:
        on_engine, served, elsewhere = asyncio.run(main())
    finally:
        engine.stop()
    assert on_engine == [("art-engine", True)] * 3
    assert served == 6  # the engine decoded around the calls
    assert elsewhere == [("art-trainer", True)]
    assert asyncio.run(runner.run_on_model(where)) == ("art-trainer", True)  # stopped: a thread
