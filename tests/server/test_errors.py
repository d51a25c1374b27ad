"""The server's errors are one tree, drawn at the top of `_errors.py`, and the drawing is true."""

from __future__ import annotations

import ast
from pathlib import Path

import art_backend
from art_backend import _errors
from tests.support.error_tree import defined_exceptions, drawn_bases, drawn_tree
from tests.support.python_source import parse_file

BACKEND = Path(art_backend.__file__).parent


def exception_classes_elsewhere() -> dict[str, str]:
    """Classes outside _errors.py whose bases name an exception (read from the source)."""
    found = {}
    for path in sorted(BACKEND.rglob("*.py")):
        if path.name == "_errors.py":
            continue
        for node in ast.walk(parse_file(path)):
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(base).endswith(("Error", "Exception", "TooLarge"))
                for base in node.bases
            ):
                found[node.name] = str(path.relative_to(BACKEND))
    return found


def test_every_exception_the_server_defines_is_defined_in_errors():
    assert exception_classes_elsewhere() == {}, "define these in _errors.py, in its tree"


def test_the_drawing_names_every_class_with_its_bases():
    assert set(drawn_tree(_errors)) == set(defined_exceptions(_errors))
    for name in drawn_tree(_errors):
        assert getattr(_errors, name).__bases__ == drawn_bases(_errors, name), name


def test_each_class_answers_with_the_status_drawn_beside_it():
    for line in (_errors.__doc__ or "").splitlines():
        words = line.split()
        if len(words) >= 3 and words[1].isdigit() and hasattr(_errors, words[0]):
            error = getattr(_errors, words[0])
            assert (error.status_code, error.error_type) == (int(words[1]), words[2].rstrip(":"))


def test_a_subclass_that_states_no_status_keeps_its_parents():
    assert _errors.ContextLengthError.status_code == 400
    assert _errors.UnsafePathError.error_type == "invalid_request_error"
    assert _errors.TrainerStateError.status_code == 409
    assert _errors.EngineStoppedError.error_type == "server_error"
