"""The client's errors: one hierarchy, drawn at the top of `art_core.errors`, true to the classes."""

from __future__ import annotations

import importlib
import pkgutil

import art_core
from art_core import errors
from tests.support.error_tree import defined_exceptions, drawn_bases, drawn_tree


def public_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class an art_core module defines under a public name."""
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(art_core.__path__, "art_core."):
        module = importlib.import_module(module_info.name)
        defined = defined_exceptions(module).items()
        found.update({name: value for name, value in defined if not name.startswith("_")})
    return found


def test_every_public_exception_of_the_client_is_defined_in_errors_and_drawn_in_its_tree():
    drawn = drawn_tree(errors)
    assert "ArtError" in drawn and drawn["ArtError"][0] is None
    exceptions = public_exceptions()
    elsewhere = {name: cls.__module__ for name, cls in exceptions.items()}
    elsewhere = {name: module for name, module in elsewhere.items() if module != "art_core.errors"}
    assert elsewhere == {}, "define these in art_core.errors (and draw them in its tree)"
    assert sorted(exceptions) == sorted(drawn) == sorted(errors.__all__)


def test_the_tree_draws_each_class_with_its_bases():
    for name in drawn_tree(errors):
        assert getattr(errors, name).__bases__ == drawn_bases(errors, name), name
