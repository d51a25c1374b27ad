"""Every test folder gets the shared fixtures of tests/support/fixtures.py."""

pytest_plugins = ["tests.support.fixtures"]
