"""The cluster recipes in deploy/ (docs/cluster.md).

The Ray cluster YAML passes Ray's own validation as `ray up` runs it, and copies with known
mistakes do not. The SkyPilot task is checked only structurally: SkyPilot is not installed here.
In both, every `art-server` and `ray start` line parses with the real argument parsers, and
every script passes `bash -n`. Nothing here reaches a machine.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
RAY_CLUSTER = ROOT / "deploy" / "ray-cluster.yaml"
SKYPILOT = ROOT / "deploy" / "skypilot.yaml"
SHELL_OPERATORS = set(";&|<>()")

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray is not installed (the [ray] extra)"
)


def load(path: Path) -> dict[str, Any]:
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(config, dict)
    return config


def as_ray_up_reads_it(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does with a config before it touches a machine (ray/autoscaler/_private/
    commands.py, `_bootstrap_config`): defaults and node types, the provider's resource
    fill-in, then the JSON schema and Ray's own checks. Raises on a config it would refuse."""
    from ray.autoscaler._private.providers import _NODE_PROVIDERS
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(config)
    provider = _NODE_PROVIDERS[prepared["provider"]["type"]](prepared["provider"])
    prepared = provider.fillout_available_node_types_resources(prepared)
    validate_config(prepared)
    return prepared


def invocations(script: str, program: str, subcommand: str | None = None) -> list[list[str]]:
    """The arguments of every call of `program` (its path's last part) in a shell script, as
    the shell would pass them: quotes removed, up to the first operator (`;`, `&`, `>` ...)."""
    calls = []
    for line in script.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for index, token in enumerate(tokens):
            if token.rsplit("/", 1)[-1] != program:
                continue
            rest = tokens[index + 1 :]
            if subcommand is not None:
                if rest[:1] != [subcommand]:
                    continue
                rest = rest[1:]
            arguments = []
            for argument in rest:
                if set(argument) <= SHELL_OPERATORS:
                    break
                arguments.append(argument)
            calls.append(arguments)
    return calls


def ray_start_options(arguments: list[str]) -> dict[str, Any]:
    """`ray start`'s options parsed by Ray's own command (click), `--resources` read as JSON."""
    from ray.scripts.scripts import start

    options = start.make_context("ray start", list(arguments)).params
    options["resources"] = json.loads(options["resources"] or "{}")
    return options


def art_server_options(arguments: list[str]) -> dict[str, Any]:
    """`art-server`'s options parsed by its own parser (an unknown flag or value exits 2)."""
    from art_backend.cli import _parser

    return vars(_parser().parse_args(arguments))


def shell_syntax_error(script: str) -> str:
    """bash's complaint about a script (`bash -n`: parsed, not run), or '' when it has none."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    result = subprocess.run([bash, "-n", "-c", script], capture_output=True, text=True)
    return result.stderr.strip() if result.returncode else ""


def ray_cluster_commands(config: dict[str, Any]) -> list[Any]:
    """Every command the nodes run, one test parameter each, named `section[index]`."""
    sections = ["setup_commands", "head_setup_commands", "head_start_ray_commands"]
    sections += ["worker_start_ray_commands"]
    return [
        pytest.param(command, id=f"{section}[{index}]")
        for section in sections
        for index, command in enumerate(config.get(section, []))
    ]


# ------------------------------------------------------------------------------ the Ray cluster


@needs_ray
def test_the_ray_cluster_yaml_validates_as_ray_up_reads_it():
    prepared = as_ray_up_reads_it(load(RAY_CLUSTER))

    assert prepared["provider"]["type"] == "local"
    assert prepared["max_workers"] == len(prepared["provider"]["worker_ips"]) == 2
    node_types = prepared["available_node_types"]
    assert [node["min_workers"] for node in node_types.values()] == [2]


@needs_ray
def test_the_head_installs_a_pinned_torch_before_the_backend():
    prepared = as_ray_up_reads_it(load(RAY_CLUSTER))
    head_setup = " && ".join(prepared["head_setup_commands"])  # setup_commands merged in first

    assert head_setup.index("python3 -m venv") < head_setup.index("torch==2.13.0")
    assert head_setup.index("torch==2.13.0") < head_setup.index("art-trainer[ray,backend]")


def resources_json_written_bare(config: dict[str, Any]) -> None:
    """The head's `ray start` line as a plain YAML scalar: `{"art_head": 1}` becomes a mapping."""
    commands = config["head_start_ray_commands"]
    commands[1] = yaml.safe_load(f"- {commands[1]}")[0]


def misspelt_section(config: dict[str, Any]) -> None:
    config["worker_start_commands"] = config.pop("worker_start_ray_commands")


def node_types_on_a_local_cluster(config: dict[str, Any]) -> None:
    config["available_node_types"] = {"gpu": {"node_config": {}, "resources": {}}}


def no_head_ip(config: dict[str, Any]) -> None:
    del config["provider"]["head_ip"]


# Each mistake, and what Ray says about it.
MISTAKES = {
    resources_json_written_bare: "is not of type 'string'",
    misspelt_section: "'worker_start_commands' was unexpected",
    node_types_on_a_local_cluster: "available_node_types is not supported for on-premise clusters",
    no_head_ip: "Please supply a `head_ip`",
}


@needs_ray
@pytest.mark.parametrize("spoil", MISTAKES, ids=lambda spoil: spoil.__name__)
def test_a_copy_with_a_known_mistake_is_refused(spoil: Callable[[dict[str, Any]], None]):
    config = copy.deepcopy(load(RAY_CLUSTER))
    spoil(config)

    with pytest.raises(Exception, match=re.escape(MISTAKES[spoil])):
        as_ray_up_reads_it(config)


@needs_ray
def test_ray_start_lines_parse_and_place_rollouts_on_workers():
    config = load(RAY_CLUSTER)
    [head] = invocations("\n".join(config["head_start_ray_commands"]), "ray", "start")
    [worker] = invocations("\n".join(config["worker_start_ray_commands"]), "ray", "start")

    head_options, worker_options = ray_start_options(head), ray_start_options(worker)
    assert head_options["head"] and head_options["num_cpus"] == 0
    assert head_options["resources"] == {"art_head": 1}
    # Without it the head's autoscaler is read-only and `ray up` never starts the workers.
    assert head_options["autoscaling_config"] == "~/ray_bootstrap_config.yaml"
    assert worker_options["address"] == "$RAY_HEAD_IP:6379"
    assert worker_options["resources"] == {"art_rollout": 8}


def test_the_ray_cluster_serves_on_every_interface_with_the_key_from_the_environment():
    start_commands = load(RAY_CLUSTER)["head_start_ray_commands"]
    [arguments] = invocations("\n".join(start_commands), "art-server")
    options = art_server_options(arguments)

    assert options["host"] == "0.0.0.0"
    assert "--api-key" not in arguments  # a command line is visible to every local user
    assert any('ART_API_KEY="$(cat ~/.art-api-key)"' in command for command in start_commands)


@pytest.mark.parametrize("command", ray_cluster_commands(load(RAY_CLUSTER)))
def test_every_ray_cluster_command_is_valid_shell(command: str):
    assert shell_syntax_error(command) == ""


# ------------------------------------------------------------------------------ the SkyPilot task


def test_the_skypilot_task_has_a_gpu_an_open_port_setup_and_run():
    task = load(SKYPILOT)

    assert task["num_nodes"] >= 2  # the server's node and at least one rollout worker
    assert task["resources"]["accelerators"]
    assert 8000 in task["resources"]["ports"]
    assert "ART_API_KEY" in task["secrets"]  # required at launch, never in the file
    assert isinstance(task["setup"], str) and isinstance(task["run"], str)


def test_the_skypilot_task_names_only_real_art_server_options():
    task = load(SKYPILOT)
    [arguments] = invocations(task["run"], "art-server")
    options = art_server_options(arguments)

    assert options["host"] == "0.0.0.0"
    assert options["port"] in task["resources"]["ports"]
    assert "--api-key" not in arguments


@needs_ray
def test_the_skypilot_ray_start_lines_parse_and_keep_off_skypilots_own_ray():
    head, worker = invocations(load(SKYPILOT)["run"], "ray", "start")

    head_options, worker_options = ray_start_options(head), ray_start_options(worker)
    assert head_options["head"] and head_options["resources"] == {"art_head": 1}
    assert head_options["port"] != 6380  # SkyPilot's own Ray cluster
    assert worker_options["address"] == f"$HEAD_IP:{head_options['port']}"
    assert worker_options["resources"] == {"art_rollout": 8}


def test_the_skypilot_scripts_are_valid_shell_and_never_stop_ray():
    task = load(SKYPILOT)

    for script in (task["setup"], task["run"]):
        assert shell_syntax_error(script) == ""
        assert invocations(script, "ray", "stop") == []  # it would stop SkyPilot's Ray too
