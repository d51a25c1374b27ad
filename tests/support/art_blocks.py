"""ART's documentation and example code, split into blocks and read for the ART names it uses.

`python -m tests.support.art_blocks /work/art-src` reads a copy of ART's docs site
(`docs/src/content/docs/**.mdx`, commits in `SOURCES-docs.json`) and of its `examples/` and `dev/`
scripts (commits and forms in `SOURCES-code.json`) and writes `tests/compat/art_docs_blocks.json`:

    {"sources": [{"path", "commit", "form", "truncated", "blocks": [
        {"line", "language", "sha", "parses", "art_imports", "calls", "hosted", "imports"}]}],
     "unread": [the paths the copy could not read]}

A block is a fenced code block of an .mdx page (`line`: its opening fence), a whole .py file
(`line` 1), a notebook's code cell (form "cells", `line`: the cell's number) or a file of which
only the import lines were copied (form "imports"). Only names, counts, keywords, line numbers and
hashes are recorded: no text of ART's code. Every Python block is read with `ast`, never run:

- `art_imports`: the ART dotted names it imports (`import art.rewards as r` -> `art.rewards`,
  `from art.local import LocalBackend` -> `art.local.LocalBackend`);
- `calls`: each call of an ART name (on a docs page or in a notebook, also through what an
  earlier block bound and this one does not rebind: read in order, as its reader reads it) (`name`, `positional`, `keywords`, `star_args`,
  `star_kwargs`, `line` in the source file, or within the cell for notebooks), including method
  calls on a name whose ART class the block makes plain (assigned from an ART constructor, bound by
  `with`, or annotated with an ART class). Every scope is read as one namespace: a name bound
  anywhere in the block to something else, or unannotated, has no type, so nothing is guessed;
- `hosted`: the hosted services it needs, by label (a provider-prefixed judge or generator model,
  ART's default judge or generator, W&B, S3, Together);
- `imports`: the top-level non-ART modules it imports.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).parents[1] / "compat" / "art_docs_blocks.json"
PYTHON_LANGUAGES = {"python", "py", "python3", "py3"}
FENCE = re.compile(r"^(?P<indent>[ \t>]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
CELL = re.compile(r"^# %% cell (\d+)\s*$")
PYTHON_CELL_MAGICS = {"capture", "time", "timeit", "prun"}  # the rest of the cell is Python

# LiteLLM-style provider prefixes: a model named so is called on that provider's hosted API.
PROVIDERS = {
    "openai": "OpenAI",
    "anthropic": "Anthropic",
    "openrouter": "OpenRouter",
    "gemini": "Gemini",
    "together_ai": "Together",
    "groq": "Groq",
    "azure": "Azure OpenAI",
    "fireworks_ai": "Fireworks",
}
LITELLM_CALLS = {"acompletion", "completion"}
# Calls whose model argument names a judge or generator:
# ART name suffix -> (positional index, keywords, ART 0.5.23's default).
MODEL_ARGUMENTS = {
    "ruler": (1, ("judge_model",), "openai/o3"),
    "ruler_score_group": (1, ("judge_model",), "openai/o3"),
    "generate_scenarios": (None, ("generator_model",), "openai/gpt-4.1-mini"),
}
OPENAI_MODELS = ("gpt-", "o1", "o3", "o4", "chatgpt-")
# A judge or generator named by a variable: maybe hosted, maybe not; said so, never guessed.
UNRESOLVED_MODEL = "judge or generator model (named by a variable)"
HOSTED_MODULES = {"wandb": "W&B", "weave": "W&B Weave", "boto3": "S3", "together": "Together"}
HOSTED_METHODS = {
    "_experimental_pull_from_s3": "S3",
    "_experimental_push_to_s3": "S3",
    "_experimental_deploy": "Together",
}


@dataclass
class Block:
    line: int
    language: str
    text: str


def mdx_blocks(text: str) -> list[Block]:
    """Every fenced code block of a page, with its language and the 1-based line of its fence."""
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, info = opening["fence"], opening["info"].strip()
        language = info.split()[0].lower() if info else ""
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = FENCE.match(lines[end])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            body.append(lines[end])
            end += 1
        prefix = opening["indent"]
        stripped = [row[len(prefix) :] if row.startswith(prefix) else row for row in body]
        blocks.append(Block(index + 1, language, textwrap.dedent("\n".join(stripped))))
        index = end + 1
    return blocks


def notebook_cells(text: str) -> list[Block]:
    """A notebook's code cells, each after its `# %% cell K` line; `line` is K. A cell magic
    other than a timing or capturing one (`%%html`, `%%bash`) makes the cell that language."""
    blocks: list[Block] = []
    for row in text.splitlines():
        header = CELL.match(row)
        if header:
            blocks.append(Block(int(header[1]), "python", ""))
        elif blocks:
            blocks[-1].text += row + "\n"
    for block in blocks:
        first = next((row.strip() for row in block.text.splitlines() if row.strip()), "")
        magic = first[2:].split()[0] if first.startswith("%%") and len(first) > 2 else ""
        if magic and magic not in PYTHON_CELL_MAGICS:
            block.language = magic
    return blocks


def import_lines(text: str) -> str:
    """A file's copied import lines as Python: an import whose names ran on past its line
    (`from art.x import (`) is read as an import of its module."""
    rows = []
    for row in text.splitlines():
        opened = re.match(r"^(\s*)from\s+([\w.]+)\s+import\s*[(\\]\s*(#.*)?$", row)
        rows.append(f"{opened[1]}import {opened[2]}" if opened else row)
    return "\n".join(rows)


def parse(text: str) -> ast.Module | None:
    """The block's tree (top-level `await` allowed, notebook magics blanked), or None."""
    source = "\n".join(
        "" if row.lstrip().startswith(("%", "!")) else row for row in text.splitlines()
    )
    try:
        tree = compile(
            source, "<block>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
    except (SyntaxError, ValueError):
        return None
    assert isinstance(tree, ast.Module)
    return tree


def _is_art(module: str | None) -> bool:
    return module is not None and (module == "art" or module.startswith("art."))


def _art_imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> the ART dotted name it is bound to by an import."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in filter(lambda a: _is_art(a.name), node.names):
                bound[alias.asname or "art"] = alias.name if alias.asname else "art"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_art(node.module):
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def imported_art_names(tree: ast.Module) -> list[str]:
    """Every ART module or name the block imports, in order of appearance, once each."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names if _is_art(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_art(node.module):
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return list(dict.fromkeys(names))


def other_imports(tree: ast.Module) -> list[str]:
    """The top-level modules, other than ART, that the block imports."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return sorted(found - {"art"})


def _bound_names(node: ast.AST) -> list[str]:
    """The names a node binds, other than by an import."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    return []


def _plain_targets(node: ast.AST) -> list[ast.expr]:
    """The Name targets whose binding's value or annotation the reader looks at."""
    if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
        return node.targets
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target]
    if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
        return [node.optional_vars]
    return []


@dataclass
class Page:
    """What a page's (or a notebook's) earlier blocks left bound, as its reader reads them in
    order: ART import aliases and the names' kinds."""

    aliases: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, set[str | None]] = field(default_factory=dict)


class Reader:
    """Resolves expressions of one block to ART dotted names and ART classes."""

    def __init__(self, tree: ast.Module, page: Page | None = None) -> None:
        page = page or Page()
        imports: dict[str, set[str | None]] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                art_names = _art_imports(ast.Module(body=[node], type_ignores=[]))
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    imports.setdefault(local, set()).add(art_names.get(local))
        rebound = {name for node in ast.walk(tree) for name in _bound_names(node)}
        # An import alias counts only where the name is bound by that one ART import and nothing else.
        self.aliases: dict[str, str] = {
            name: next(iter(dotted))
            for name, dotted in imports.items()
            if len(dotted) == 1 and None not in dotted and name not in rebound
        }
        # A block uses what the page's earlier blocks bound, where it binds nothing itself.
        for name, dotted_name in page.aliases.items():
            if name not in imports and name not in rebound:
                self.aliases[name] = dotted_name
        self.plain_targets = {
            id(target) for node in ast.walk(tree) for target in _plain_targets(node)
        }
        self.kinds: dict[str, set[str | None]] = {}
        for name in imports:
            if name not in self.aliases:
                self.kinds.setdefault(name, set()).add(None)
        for node in ast.walk(tree):
            for name, kind in self._bindings(node):
                self.kinds.setdefault(name, set()).add(kind)
        for name, kinds in page.kinds.items():
            if name not in self.kinds and name not in self.aliases:
                self.kinds[name] = kinds
        page.aliases, page.kinds = dict(self.aliases), dict(self.kinds)

    def _bindings(self, node: ast.AST) -> list[tuple[str, str | None]]:
        """(name, what this binding makes it: `instance:ArtClass` or None, unknown)."""
        if isinstance(node, ast.arg):
            return [(node.arg, self._annotation_kind(node.annotation))]
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            return [
                (t.id, self._value_kind(node.value))
                for t in node.targets
                if isinstance(t, ast.Name)
            ]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [(node.target.id, self._annotation_kind(node.annotation))]
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            return [(node.optional_vars.id, self._value_kind(node.context_expr))]
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            return [] if id(node) in self.plain_targets else [(node.id, None)]
        return [(name, None) for name in _bound_names(node)]

    def dotted(self, node: ast.expr) -> str | None:
        """`art.rewards.ruler` or an alias of an ART import -> its ART dotted name."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _class(self, node: ast.expr) -> str | None:
        dotted = self.dotted(node)
        if dotted is None:
            return None
        last = dotted.rsplit(".", 1)[-1]
        return dotted if last[:1].isupper() and not last.isupper() else None

    def _annotation_kind(self, node: ast.expr | None) -> str | None:
        if node is None:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return None
        optional = isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
        if optional and isinstance(node.right, ast.Constant) and node.right.value is None:
            node = node.left
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Optional":
            node = node.slice
        cls = self._class(node)
        return f"instance:{cls}" if cls else None

    def _value_kind(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Call):
            cls = self._class(node.func)
            return f"instance:{cls}" if cls else None
        return None

    def receiver_class(self, node: ast.expr) -> str | None:
        """The ART class of a name every binding of which gives that one class, else None."""
        if not isinstance(node, ast.Name):
            return None
        kinds = self.kinds.get(node.id, set())
        if len(kinds) == 1:
            (kind,) = kinds
            if kind and kind.startswith("instance:"):
                return kind.removeprefix("instance:")
        return None

    def called_name(self, call: ast.Call) -> str | None:
        """The ART name a call calls: a function or class, or a method of a known receiver."""
        dotted = self.dotted(call.func)
        if dotted:
            return dotted
        if isinstance(call.func, ast.Attribute):
            cls = self.receiver_class(call.func.value)
            if cls:
                return f"{cls}.{call.func.attr}"
        return None


def _string(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _model_argument(name: str, call: ast.Call) -> tuple[bool, str | None]:
    """(whether `name` takes a judge or generator model, the one this call names if a string)."""
    for suffix, (index, keywords, default) in MODEL_ARGUMENTS.items():
        if name.endswith(f".{suffix}"):
            for keyword in call.keywords:
                if keyword.arg in keywords:
                    return True, _string(keyword.value)
            if index is not None and len(call.args) > index:
                return True, _string(call.args[index])
            return True, default
    return False, None


def _provider(model: str | None) -> str | None:
    """`<Provider> model` for the hosted API a LiteLLM-style model name calls (its prefix, or
    OpenAI for a bare OpenAI model name, LiteLLM's default), else None."""
    if model is None:
        return None
    prefix = model.split("/", 1)[0].lower()
    if "/" not in model:
        prefix = "openai" if model.lower().startswith(OPENAI_MODELS) else ""
    return f"{PROVIDERS[prefix]} model" if prefix in PROVIDERS else None


def _litellm_models(tree: ast.Module) -> set[str]:
    """The hosted models of the block's own LiteLLM calls (`acompletion(model="openai/...")`)."""
    found: set[str | None] = set()
    for node in ast.walk(tree):
        name = getattr(node, "func", None)
        if (
            isinstance(node, ast.Call)
            and getattr(name, "attr", getattr(name, "id", "")) in LITELLM_CALLS
        ):
            found |= {_provider(_string(k.value)) for k in node.keywords if k.arg == "model"}
            found |= {_provider(_string(node.args[0]))} if node.args else set()
    return {label for label in found if label}


def hosted_services(
    tree: ast.Module, calls: list[tuple[str, ast.Call]], imports: list[str]
) -> list[str]:
    """Labels of the hosted services the block needs (judge/generator models, W&B, S3, Together)."""
    found = {HOSTED_MODULES[module] for module in imports if module in HOSTED_MODULES}
    for name, call in calls:
        takes_model, model = _model_argument(name, call)
        provider = _provider(model)
        if takes_model and provider:
            found.add(provider)
        elif takes_model and model is None:
            found.add(UNRESOLVED_MODEL)
        method = name.rsplit(".", 1)[-1]
        if method in HOSTED_METHODS:
            found.add(HOSTED_METHODS[method])
        if name.endswith("TogetherDeploymentConfig"):
            found.add("Together")
    found |= _litellm_models(tree)
    for node in ast.walk(tree):
        text = _string(node) if isinstance(node, ast.Constant) else None
        if text and text.startswith("s3://"):
            found.add("S3")
        if text == "wandb":
            found.add("W&B")
    return sorted(found)


def analyse(text: str, language: str, line_offset: int, page: Page | None = None) -> dict[str, Any]:
    """The record of one block: hash, language, whether it parses, its ART imports and calls.
    `page` (updated here) is what the page's earlier blocks bound."""
    record: dict[str, Any] = {
        "language": language,
        "sha": hashlib.sha256(text.encode()).hexdigest()[:12],
    }
    if language not in PYTHON_LANGUAGES:
        return record
    tree = parse(text)
    record["parses"] = tree is not None
    if tree is None:
        return record
    reader = Reader(tree, page)
    calls: list[tuple[str, ast.Call]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = reader.called_name(node)
            if name:
                calls.append((name, node))
    calls.sort(key=lambda item: (item[1].lineno, item[1].col_offset, item[0]))
    imports = other_imports(tree)
    record["art_imports"] = imported_art_names(tree)
    record["calls"] = [
        {
            "name": name,
            "line": call.lineno + line_offset,
            "positional": sum(not isinstance(a, ast.Starred) for a in call.args),
            "keywords": [k.arg for k in call.keywords if k.arg is not None],
            "star_args": any(isinstance(a, ast.Starred) for a in call.args),
            "star_kwargs": any(k.arg is None for k in call.keywords),
        }
        for name, call in calls
    ]
    record["hosted"] = hosted_services(tree, calls, imports)
    record["imports"] = imports
    return record


def source_blocks(path: str, text: str, form: str) -> list[dict[str, Any]]:
    """The records of every block of one source file."""
    # A page's (or a notebook's) later blocks use what its earlier ones imported.
    page = Page()
    if path.endswith(".mdx"):
        # A fence's body starts on the line after it: call lines are the page's own.
        return [
            {"line": b.line, **analyse(b.text, b.language, b.line, page)} for b in mdx_blocks(text)
        ]
    if form == "cells":
        return [
            {"line": b.line, **analyse(b.text, b.language, 0, page)} for b in notebook_cells(text)
        ]
    if form == "imports":
        return [{"line": 1, **analyse(import_lines(text), "python", 0)}]
    return [{"line": 1, **analyse(text, "python", 0)}]


# The copied file's suffix for each form, and the ART path it stands for.
FORMS = {".ipynb.cells.py": ("cells", ".ipynb"), ".py.imports": ("imports", ".py")}


def collect(root: Path) -> dict[str, Any]:
    """Every source under `root` (docs pages, examples/ and dev/ scripts) and its blocks."""
    manifest: dict[str, dict[str, Any]] = {}
    for name in ("SOURCES-docs.json", "SOURCES-code.json"):
        if (root / name).exists():
            manifest.update(json.loads((root / name).read_text()))
    files = sorted((root / "docs").rglob("*.mdx")) if (root / "docs").exists() else []
    for folder in ("examples", "dev"):
        if (root / folder).exists():
            files += sorted(p for p in (root / folder).rglob("*") if p.is_file())
    sources = []
    for file in files:
        copied = file.relative_to(root).as_posix()
        path, form = copied, "file"
        for suffix, (form_name, original) in FORMS.items():
            if copied.endswith(suffix):
                path, form = copied.removesuffix(suffix) + original, form_name
        if not (copied.endswith((".mdx", ".py")) or form != "file"):
            continue
        entry = manifest.get(path) or manifest.get(copied) or {}
        if "error" in entry:
            continue
        written, total = entry.get("written_chars"), entry.get("total_chars")
        sources.append(
            {
                "path": path,
                "commit": entry.get("commit", "unknown"),
                "form": entry.get("form", form),
                "truncated": written is not None and total is not None and written < total,
                "blocks": source_blocks(
                    path, file.read_text(encoding="utf-8"), entry.get("form", form)
                ),
            }
        )
    unread = sorted(path for path, entry in manifest.items() if "error" in entry)
    return {"sources": sorted(sources, key=lambda s: s["path"]), "unread": unread}


def main(argv: list[str]) -> None:
    """Read the copy at argv[0] and write tests/compat/art_docs_blocks.json."""
    if len(argv) != 1:
        raise SystemExit("usage: python -m tests.support.art_blocks /path/to/art-src")
    data = collect(Path(argv[0]))
    OUTPUT.write_text(json.dumps(data, indent=1) + "\n")
    blocks = sum(len(source["blocks"]) for source in data["sources"])
    print(f"{OUTPUT}: {len(data['sources'])} sources, {blocks} blocks")


if __name__ == "__main__":
    main(sys.argv[1:])
