"""art_mcp when the server or the model misbehaves: pooled sessions that crash, waiters that
are cancelled, a server that never answers the handshake or goes silent after it, tool listings
that fail, results of megabytes, tools that fill the model's context, and a generator whose
context is too small for `art mcp-train`. Every server here is a real MCP server
(tests/mcp/toy_server.py) over stdio, streamable HTTP or in process."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
from pathlib import Path

import pytest

import art_core as art
import art_mcp
from examples.mcp_servers.inventory_server import create_server
from tests.mcp.toy_server import toy_server
from tests.support.scripted_judge import call

TOY_SERVER_PATH = Path(__file__).with_name("toy_server.py")
TOY = [str(TOY_SERVER_PATH)]


def tool_texts(trajectory: art.Trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages() if m["role"] == "tool"]


@pytest.mark.timeout(120)
async def test_rollouts_waiting_for_a_pooled_session_wake_when_the_lent_ones_crash(policy):
    """Two sessions, four rollouts: the first two crash their servers, the two waiting for a
    session get new ones and finish (before the fix they waited forever)."""
    scripted, model = policy
    scripted.default = lambda body: (
        call("crash")
        if "crash" in body["messages"][1]["content"] and body["messages"][-1]["role"] == "user"
        else call("complete_task", {"summary": "done"})
    )
    server = art_mcp.McpServer.from_command(sys.executable, TOY, pool_size=2)
    async with server:
        await server.list_tools()  # cached: the rollouts go straight for a session, in order
        outcomes = await asyncio.gather(
            *(
                art_mcp.rollout(model, server, task)
                for task in ("crash 1", "crash 2", "finish 3", "finish 4")
            ),
            return_exceptions=True,
        )
        crashed = [o for o in outcomes[:2] if isinstance(o, art_mcp.McpServerError)]
        finished = [o for o in outcomes[2:] if isinstance(o, art.Trajectory)]
        assert len(crashed) == 2 and len(finished) == 2, outcomes
        assert all(t.metrics["task_completed"] for t in finished)
        assert server._pool is not None and server._pool.qsize() == 2  # both tickets are back


@pytest.mark.timeout(120)
async def test_waiters_fail_counted_when_the_server_is_gone_for_good(policy, tmp_path: Path):
    """Over stdio with a command that dies at once: every waiter wakes and fails."""
    scripted, model = policy
    scripted.default = call("complete_task", {"summary": "done"})
    gone = tmp_path / "gone.py"
    gone.write_text("raise SystemExit(1)\n")
    server = art_mcp.McpServer.from_command(sys.executable, [str(gone)], pool_size=1)
    outcomes = await asyncio.gather(
        *(art_mcp.rollout(model, server, f"task {k}") for k in range(3)), return_exceptions=True
    )
    assert all(isinstance(o, art_mcp.McpServerError) for o in outcomes), outcomes
    assert server._pool is not None and server._pool.qsize() == 1  # the slot is free again


@pytest.mark.timeout(120)
async def test_a_waiter_cancelled_as_the_session_comes_back_passes_it_on():
    """One pooled session, lent, and three rollouts waiting for it. It comes back and the first
    waiter, the one it is handed to, is cancelled in the same event-loop turn: the other two
    still get it in turn (a `Condition` on Python 3.11 dropped that wakeup, and they waited
    forever beside the idle session)."""
    server = art_mcp.McpServer.from_object(toy_server(), pool_size=1)
    async with server:
        [search] = [tool for tool in await server.list_tools() if tool.name == "notes.search"]

        async def search_in_a_pooled_session(query: str) -> str:
            async with server.session() as session:
                return (await session.call_tool(search, {"query": query})).text

        async with server.session():
            waiters = [asyncio.create_task(search_in_a_pooled_session(f"q{k}")) for k in range(3)]
            await asyncio.sleep(0.5)  # time for all three to queue up for the lent session
            assert not any(waiter.done() for waiter in waiters)
        waiters[0].cancel()  # nothing awaited since the session came back: the same turn
        try:
            texts = await asyncio.wait_for(asyncio.gather(*waiters[1:]), timeout=60)
        finally:
            for waiter in waiters:
                waiter.cancel()
        assert texts == ["dot:q1", "dot:q2"] and waiters[0].cancelled()
        assert server._pool is not None and server._pool.qsize() == 1  # idle in the pool again


@pytest.mark.timeout(60)
async def test_a_server_that_never_answers_the_handshake_fails_named_and_leaves_no_unread_error(
    caplog: pytest.LogCaptureFixture,
):
    """The handshake times out as `McpServerError`; the session's failure, which nobody waits
    for any more, is not left in a future for asyncio to log as "never retrieved"."""
    server = art_mcp.McpServer.from_command(sys.executable, [*TOY, "--mute"], connect_timeout=1.0)
    with pytest.raises(art_mcp.McpServerError, match=r"handshake within 1 s \(connect_timeout\)"):
        await server.list_tools()
    await asyncio.sleep(0.1)  # the transport's last callbacks let go of the session
    gc.collect()  # a future holding an unread exception says so when it is collected
    assert "never retrieved" not in caplog.text, caplog.text


@pytest.mark.parametrize(
    ("listing", "says"),
    [
        (
            "error",
            r"answered list_tools with an error \(-32603: the tool registry is corrupt\)\. .*"
            r"check that list_tools works in another MCP client",
        ),
        (
            "malformed",
            r"answered list_tools with a result that is not valid MCP \(tools\.0\.description: "
            r".*\)\. The server breaks the protocol: update its MCP SDK, or fix what it returns",
        ),
        (
            "exit",
            r"failed during list_tools: MCPError: Connection closed\. Check the command runs on "
            r"its own.*\n.*stderr ends with:\nlisting the tools: out of memory",
        ),
    ],
)
async def test_a_tool_listing_that_fails_is_a_server_failure_counted_like_the_others(
    listing: str, says: str, policy
):
    """An error for an answer to tools/list, an answer that is not a tool listing, and a server
    that exits between two pages: `McpServerError` (what `art_mcp.train` counts as
    `mcp/failed_rollouts`), with a message that says what to do; no SDK exception escapes."""
    scripted, model = policy
    server = art_mcp.McpServer.from_command(sys.executable, [*TOY, "--bad-listing", listing])
    with pytest.raises(art_mcp.McpServerError, match=says):
        await server.list_tools()
    failure = await failed_rollout(model, server)
    assert "list_tools" in failure.message
    assert scripted.requests == []  # it failed before the model was asked anything


async def failed_rollout(model, server: art_mcp.McpServer) -> art.RolloutException:
    """A rollout against `server` in a gather, as a training run makes it: the server's failure
    is kept on its group as an `McpServerError` (what `art_mcp.train` counts)."""
    [group] = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([art_mcp.rollout(model, server, "anything")])],
        max_exceptions=1,
        show_progress=False,
    )
    [failure] = group.exceptions
    assert failure.type == "McpServerError"
    return failure


@pytest.mark.timeout(60)
async def test_a_server_silent_after_the_handshake_fails_within_the_request_timeout(policy):
    scripted, model = policy
    server = art_mcp.McpServer.from_command(sys.executable, [*TOY, "--silent"], request_timeout=1.0)
    with pytest.raises(art_mcp.McpServerError, match=r"no answer to list_tools within 1 s"):
        await server.list_tools()
    # In a training run the rollout fails as any server failure does: kept on its group.
    assert "request_timeout" in (await failed_rollout(model, server)).message
    assert scripted.requests == []  # it failed before the model was asked anything


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_2_mb_result_is_cut_to_the_limit_with_its_marker(
    transport: str, policy, toy_http_url: str
):
    scripted, model = policy
    scripted.queue(call("huge", {"size": 2_000_000}), call("complete_task", {"summary": "ok"}))
    server = (
        art_mcp.McpServer.from_url(toy_http_url)
        if transport == "http"
        else art_mcp.McpServer.from_command(sys.executable, TOY)
    )
    trajectory = await art_mcp.rollout(model, server, "read it all")
    [text] = tool_texts(trajectory)
    assert f"[... {2_000_000 - server.max_result_chars} characters cut ...]" in text
    assert text.endswith("END") and len(text) < server.max_result_chars + 100
    assert trajectory.metrics["truncated_results"] == 1
    assert trajectory.metrics["task_completed"] is True


@pytest.mark.timeout(180)
async def test_a_50_mb_result_over_stdio_is_cut_to_the_limit_not_timed_out(policy):
    """One line of 100 MB on the server's stdout (the SDK's servers send a text result twice, as
    content and as structured content), max_message_bytes raised to hold it: cut like any long
    result, within call_timeout (the SDK's own reader, quadratic in the length of a line, took
    over a minute, and the call timed out)."""
    scripted, model = policy
    scripted.queue(call("huge", {"size": 50_000_000}), call("complete_task", {"summary": "ok"}))
    server = art_mcp.McpServer.from_command(
        sys.executable, TOY, max_message_bytes=128 * 2**20, call_timeout=30
    )
    trajectory = await art_mcp.rollout(model, server, "read it all")
    [text] = tool_texts(trajectory)
    assert trajectory.metrics["tool_timeouts"] == 0, text
    assert f"[... {50_000_000 - server.max_result_chars} characters cut ...]" in text
    assert text.endswith("END") and len(text) < server.max_result_chars + 100
    assert trajectory.metrics["task_completed"] is True


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_a_result_over_max_message_bytes_names_the_option(
    transport: str, policy, toy_http_url: str
):
    """Over stdio as over HTTP: the message is refused as soon as it is over the bound, never
    read whole into memory."""
    scripted, model = policy
    scripted.queue(call("huge", {"size": 300_000}))
    server = (
        art_mcp.McpServer.from_url(toy_http_url, max_message_bytes=100_000)
        if transport == "http"
        else art_mcp.McpServer.from_command(sys.executable, TOY, max_message_bytes=100_000)
    )
    with pytest.raises(art_mcp.McpServerError, match="max_message_bytes"):
        await art_mcp.rollout(model, server, "read it all")


# ----------------------------------------------------------------- the model's context window


async def test_tools_that_fill_the_context_are_named_before_any_rollout(
    tiny_model: art.TrainableModel,
):
    """The tiny model's context is 2048 tokens; the inventory server's five tools and a
    1000-token answer do not fit, one tool does."""
    server = art_mcp.McpServer.from_object(create_server())
    with pytest.raises(art_mcp.McpContextError) as caught:
        await art_mcp.check_context(tiny_model, server, max_tokens=1000)
    message = str(caught.value)
    assert "context of 2048 tokens" in message and "max_tokens=1000" in message
    assert "the schemas of the 5 tools" in message and "counted by the model's server" in message
    assert "allowed_tools" in message and "--tools" in message
    assert "search_items ~" in message  # the largest tools, with estimates
    narrow = art_mcp.McpServer.from_object(create_server(), allowed_tools=["low_stock_report"])
    await art_mcp.check_context(tiny_model, narrow, max_tokens=24)


def test_timeouts_must_be_positive():
    with pytest.raises(ValueError, match="request_timeout"):
        art_mcp.McpServer.from_command(sys.executable, TOY, request_timeout=0)


@pytest.mark.timeout(300)
def test_mcp_train_prints_one_line_when_the_generator_context_is_too_small(
    tiny_model_dir: Path, tmp_path: Path
):
    """The generator (the base model: the tiny one) cannot fit the server's long description;
    the command says so in one line, with no traceback, and exits 1."""
    server = f"{sys.executable} {TOY_SERVER_PATH} --prompt-chars 4000"
    options = ["--model", str(tiny_model_dir), "--path", str(tmp_path / ".art")]
    options += ["--tools", "notes.search", "--max-tokens", "16", "--scenarios", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "art_core.cli", "mcp-train", "--stdio", server, *options],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("art mcp-train:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    [error] = errors
    assert "scenario generator" in error and "context of 2048 tokens" in error
    assert "--generator" in error and "Judge" not in error
