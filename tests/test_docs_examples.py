"""Every Python example in README.md and the manual (docs/) runs, or says why it cannot; every
relative link in them points at a file that exists.

A ```python block runs as a program of its own: a fresh interpreter in a temporary folder (with
`examples/` linked in), top-level `await` allowed, against the tiny test model. The session's
server on 127.0.0.1 stands in for `http://127.0.0.1:8000` and the tiny model's folder for
`"smollm2-135m-instruct"`; the training loop of the README (and of getting-started) runs 3 of
its 8 steps (`substituted`). An HTML comment on the line right before the fence changes that,
and any other comment there is an error:

    <!-- not run: REASON -->            not run; the reason is required
    <!-- run with: model, backend -->   runs with these names bound: `model`, a freshly
                                        registered `art.TrainableModel` on the tiny model, and
                                        `backend`, its `RemoteBackend`
    <!-- run with: openai=o3 -->        a hosted model the block names (`"openai/o3"`) is a local
                                        art-server: the tiny model served as `o3` behind an API
                                        key, started on first use (one per name, for the module),
                                        and OPENAI_BASE_URL / OPENAI_API_KEY point the block at it,
                                        as a user points ART at any OpenAI-compatible server

The two forms combine (`run with: model, backend, openai=o3`); one `openai=` per block, as the
environment names one OpenAI endpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.servers import RunningServer, running_server

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)```(?P<language>\S*)\s*$")
COMMENT = re.compile(r"^\s*<!--(?P<text>.*)-->\s*$")
MARK = re.compile(r"^\s*(?P<kind>not run|run with):(?P<value>.*)$", re.DOTALL)
BOUND_NAMES = {"model", "backend"}
OPENAI_SERVED = re.compile(r"^openai=(?P<name>[A-Za-z0-9][A-Za-z0-9._/-]*)$")
OPENAI_KEY = "docs-openai-key"
README_STEPS, STEPS_HERE = 8, 3  # the README's training loop; here, where 3 show the steps advance
SECONDS_PER_BLOCK = 150


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it opens (1-based line of the fence), its language and code,
    and the HTML comment on the line before it (without `<!--` and `-->`), if any."""

    page: Path
    line: int
    language: str
    code: str
    comment: str | None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def mark(self) -> tuple[str, str] | None:
        match = MARK.match(self.comment or "")
        return (match["kind"], match["value"].strip()) if match else None

    @property
    def run_with(self) -> list[str]:
        """The items of a `run with:` mark (none for a block without one)."""
        if self.mark is None or self.mark[0] != "run with":
            return []
        return [item.strip() for item in self.mark[1].split(",")]

    @property
    def bound_names(self) -> list[str]:
        """The names the block runs with bound (`model`, `backend`)."""
        return [item for item in self.run_with if item in BOUND_NAMES]

    @property
    def openai_name(self) -> str | None:
        """The name the block's `openai=NAME` serves the tiny model under, if it has one."""
        served = [match["name"] for item in self.run_with if (match := OPENAI_SERVED.match(item))]
        return served[0] if served else None


def fenced_blocks(page: Path) -> Iterator[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    start = 0
    while start < len(lines):
        opening = FENCE.match(lines[start])
        if opening is None:
            start += 1
            continue
        indent, end = len(opening["indent"]), start + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        comment = COMMENT.match(lines[start - 1]) if start else None
        yield Block(
            page=page,
            line=start + 1,
            language=opening["language"],
            code="\n".join(line[indent:] for line in lines[start + 1 : end]),
            comment=comment["text"].strip() if comment else None,
        )
        start = end + 1


BLOCKS = [block for page in PAGES for block in fenced_blocks(page)]
PYTHON = [block for block in BLOCKS if block.language == "python"]
NOT_RUN = [block for block in PYTHON if block.mark and block.mark[0] == "not run"]
RUNNABLE = [block for block in PYTHON if block not in NOT_RUN]


def test_python_blocks_are_found_and_fenced_as_python():
    assert len(PYTHON) >= 10
    others = [str(b) for b in BLOCKS if b.language.lower() in {"py", "python3", "pycon", "py3"}]
    assert others == [], "write ```python, so that the block is collected and run"


def mark_problem(block: Block) -> str | None:
    """What is wrong with the comment before `block`, or None for a known, well-formed mark."""
    if block.mark is None:
        return f"unknown mark <!-- {block.comment} -->"
    if block.mark[0] == "run with":
        unknown = [i for i in block.run_with if i not in BOUND_NAMES and not OPENAI_SERVED.match(i)]
        if unknown:
            return f"run with: {sorted(BOUND_NAMES)} or openai=NAME, not {unknown}"
        if len([item for item in block.run_with if OPENAI_SERVED.match(item)]) > 1:
            return "one openai=NAME per block: the environment names one endpoint"
    return None


@pytest.mark.parametrize("block", [b for b in PYTHON if b.comment is not None], ids=str)
def test_a_comment_before_a_python_block_is_a_known_mark(block: Block):
    assert mark_problem(block) is None, mark_problem(block)


@pytest.mark.parametrize(
    ("comment", "problem"),
    [
        ("run with: model, backend, openai=o3", None),
        ("run with: openai=z-ai/glm-5", None),
        ("not run: needs a GPU-only model", None),
        ("run with: modle", "not ['modle']"),
        ("run with: openai=", "not ['openai=']"),
        ("run with: openai=o3 o4-mini", "not ['openai=o3 o4-mini']"),
        ("run with: openai=o3, openai=o4-mini", "one openai=NAME per block"),
        ("run: model", "unknown mark"),
    ],
)
def test_the_marks_grammar_is_strict(comment: str, problem: str | None):
    block = Block(page=README, line=1, language="python", code="", comment=comment)
    found = mark_problem(block)
    assert found is None if problem is None else problem in str(found)


@pytest.mark.parametrize("block", NOT_RUN, ids=str)
def test_a_block_not_run_says_why(block: Block):
    assert block.mark is not None
    assert len(block.mark[1]) >= 10, "<!-- not run: REASON --> needs the reason"


# ------------------------------------------------------------------------ running the examples


@pytest.fixture(scope="module")
def docs_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, engine_options: dict
) -> Iterator[RunningServer]:
    """The tiny model served as `smollm2`, the name the examples use."""
    path = tmp_path_factory.mktemp("art-docs")
    with running_server(tiny_model_dir, path, name="smollm2", **engine_options) as running:
        yield running


@pytest.fixture(scope="module")
def openai_servers(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, engine_options: dict
) -> Iterator[Callable[[str], RunningServer]]:
    """The tiny model served under a hosted model's name (`o3`) behind an API key, started the
    first time a block names it: a local stand-in for the OpenAI API."""
    started: dict[str, RunningServer] = {}
    with contextlib.ExitStack() as stack:

        def serving(name: str) -> RunningServer:
            if name not in started:
                path = tmp_path_factory.mktemp("art-openai")
                server = running_server(
                    tiny_model_dir, path, name=name, api_key=OPENAI_KEY, **engine_options
                )
                started[name] = stack.enter_context(server)
            return started[name]

        yield serving


def substituted(code: str, server: RunningServer, tiny_model_dir: Path) -> str:
    """The example as it runs here: the tiny model and the test server in place of SmolLM2 and
    a server on port 8000, and the README's training loop (8 steps) cut to 3."""
    code = code.replace('"smollm2-135m-instruct"', json.dumps(str(tiny_model_dir)))
    code = code.replace(f"for _ in range({README_STEPS}):", f"for _ in range({STEPS_HERE}):")
    return code.replace("http://127.0.0.1:8000", server.url)


# Runs one block (argv: the page, the code file, the names to bind). The code is compiled under
# the page's name, padded to its line there, so a traceback points at the page's own line.
RUNNER = """
import ast, asyncio, inspect, os, sys

page, code_file, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(code_file, encoding="utf-8") as file:
    code = compile(file.read(), page, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__"}


async def main():
    backend = None
    if names:
        import art_core as art

        backend = art.RemoteBackend(os.environ["ART_DOCS_URL"])
        model = art.TrainableModel(
            name=os.environ["ART_DOCS_MODEL_NAME"], project="docs",
            base_model=os.environ["ART_DOCS_BASE_MODEL"],
        )
        await model.register(backend)
        bound = {"model": model, "backend": backend}
        namespace.update({name: bound[name] for name in names})
    result = eval(code, namespace)
    if inspect.iscoroutine(result):
        await result
    if backend is not None:
        await backend.close()


if names or code.co_flags & inspect.CO_COROUTINE:
    asyncio.run(main())
else:
    exec(code, namespace)
"""


@pytest.mark.timeout(SECONDS_PER_BLOCK + 30)
@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_the_example_runs(
    block: Block,
    docs_server: RunningServer,
    openai_servers: Callable[[str], RunningServer],
    tiny_model_dir: Path,
    tmp_path: Path,
):
    code_file = tmp_path / "example.py"
    code = substituted(block.code, docs_server, tiny_model_dir)
    code_file.write_text("\n" * block.line + code, encoding="utf-8")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {key: value for key, value in os.environ.items() if not key.startswith("LANGFUSE_")}
    if block.openai_name is not None:
        openai = openai_servers(block.openai_name)
        env |= {"OPENAI_BASE_URL": f"{openai.url}/v1", "OPENAI_API_KEY": OPENAI_KEY}
    env |= {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "ART_DOCS_URL": docs_server.url,
        "ART_DOCS_BASE_MODEL": str(tiny_model_dir),
        "ART_DOCS_MODEL_NAME": f"docs-{block.page.stem}-{block.line}",
    }
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(block.page), str(code_file), *block.bound_names],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SECONDS_PER_BLOCK,
    )
    assert done.returncode == 0, f"{block} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    if PRINTS_STEPS in block.code:
        steps = [int(match[1]) for match in STEP_LINE.finditer(done.stdout)]
        assert steps, f"{block} printed no step:\n{done.stdout[-3000:]}"
        assert steps == list(range(1, len(steps) + 1)), f"{block}: a step trained nothing: {steps}"


# An example that prints `step N: reward ...` after each training call (the README's, the first
# loop of the getting-started page) must train every step, here on the tiny random model: its
# reward gives partial credit, so each group has a spread. On SmolLM2 it is measured by hand
# (the README gives the figures): 8 steps take minutes there, seconds here.
PRINTS_STEPS = 'print(f"step {result.step}: reward '
STEP_LINE = re.compile(r"^step (\d+): reward ", re.MULTILINE)


def test_the_readme_trains_an_agent_and_prints_each_step():
    section = README.read_text(encoding="utf-8").split("## Train an agent", 1)[1].split("\n## ")[0]
    trains = [b for b in RUNNABLE if b.page == README and b.code in section]
    assert len(trains) == 1
    assert "backend.train(" in trains[0].code and PRINTS_STEPS in trains[0].code
    assert f"for _ in range({README_STEPS}):" in trains[0].code  # cut to STEPS_HERE here


def test_the_readme_lists_every_page_of_the_manual():
    """Every page under docs/ is named in the README's list, but the site's home page (the
    README's twin) and the benchmarks page (the README links BENCHMARKS.md, which it includes)."""
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", README.read_text(encoding="utf-8")))
    pages = {str(page.relative_to(ROOT)) for page in (ROOT / "docs").rglob("*.md")}
    assert pages - linked == {"docs/index.md", "docs/benchmarks.md"}


# ---------------------------------------------------------------------------------------- links

LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)[^)]*\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    targets = (match["target"] for match in LINK.finditer(text))
    return [t for t in targets if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|#", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(page: Path):
    links = relative_links(page)
    missing = [link for link in links if not (page.parent / link.split("#")[0]).exists()]
    assert missing == []
