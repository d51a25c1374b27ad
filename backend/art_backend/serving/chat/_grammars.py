"""A chat request's grammar: which one it needs, compiled in a lane of its own so that a slow
one delays only other grammars.

Compiling a schema builds llguidance's lexer against the whole vocabulary: a third of a second to
over a second for the largest schema the limits allow (`_limits.MAX_SCHEMA_PROPERTIES`), several
on a busy machine. llguidance releases the interpreter lock meanwhile, so a thread is enough; what
matters is which thread. On the pool where every request is tokenized, four such requests held
both threads of a 2-core machine while a small chat waited 3.56 s behind them (issue 49). Here at
most `GRAMMAR_THREADS` grammars compile at once, the others queue behind them, and a request with
nothing to enforce never enters.

A request cancelled while it waits in the queue (its client went away) leaves it without
compiling. One already compiling runs to its end, as llguidance's compile cannot be interrupted,
and holds its thread until then; its grammar is kept (`GrammarCompiler`), so a retry does not
compile it again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from art_backend._errors import InvalidRequestError
from art_backend.engines._constrained import Grammar, GrammarCompiler, strict_function_names
from art_backend.serving.chat._schemas import ChatCompletionRequest

# Half the cores: the engine and the tokenizing pool need the others.
GRAMMAR_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))

GrammarBuild = Callable[[], Grammar | None]


def grammar_build(
    compiler: GrammarCompiler,
    request: ChatCompletionRequest,
    tools: list[dict],
    tool_choice: Any,
) -> GrammarBuild | None:
    """The compile of the request's grammar, to run in a `GrammarLane`; None when the request
    has nothing to enforce."""
    forced_tools = tools and tool_choice not in ("none", "auto")
    response_format = request.response_format
    wants_format = response_format is not None and response_format.get("type") != "text"
    if forced_tools and wants_format:
        raise InvalidRequestError(
            "response_format cannot be combined with a forced tool_choice; drop one of them.",
            param="response_format",
        )
    if forced_tools:
        return functools.partial(
            compiler.for_tool_choice, tools, tool_choice, request.parallel_tool_calls
        )
    if wants_format:
        # The format grammar leaves no room for `<tool_call>` blocks, strict tools or not.
        return functools.partial(compiler.for_response_format, response_format)
    if tools and tool_choice == "auto" and strict_function_names(tools):
        # Calls the model opens are enforced when some function is `strict`.
        return functools.partial(
            compiler.for_tool_choice, tools, tool_choice, request.parallel_tool_calls
        )
    return None


class GrammarLane:
    """Runs grammar compiles on `threads` threads of their own, first come first served."""

    def __init__(self, threads: int = GRAMMAR_THREADS) -> None:
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="art-grammar")
        self._lock = threading.Lock()
        self.compiling = 0  # compiles running now (art_grammars_compiling)
        self.compiles = 0  # compiles begun (art_grammar_compiles_total): none for a cancelled wait

    async def compile(self, build: GrammarBuild) -> Grammar | None:
        """`build()` on a lane thread once one is free; cancelled before it starts, it never runs."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._run, build)

    def _run(self, build: GrammarBuild) -> Grammar | None:
        with self._lock:
            self.compiling += 1
            self.compiles += 1
        try:
            return build()
        finally:
            with self._lock:
                self.compiling -= 1
