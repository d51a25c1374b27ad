"""Every test folder gets the shared fixtures of tests/support/fixtures.py, and the suite's groups
and order for parallel runs (tests/support/suite_order.py)."""

import pytest

pytest_plugins = ["tests.support.fixtures", "tests.support.suite_order"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        default="torch",
        choices=["torch", "vllm"],
        help="the engine the test servers run (vllm: make test-vllm, ART_VLLM_PYTHON set)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of the torch engine's insides skip when the servers run on vLLM, and the other way."""
    engine = config.getoption("--engine")
    for item in items:
        if engine == "vllm" and item.get_closest_marker("torch_engine"):
            item.add_marker(pytest.mark.skip(reason="looks inside the torch engine"))
        if engine != "vllm" and item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.skip(reason="needs --engine vllm (make test-vllm)"))
