"""The server's errors are one tree, drawn at the top of `_errors.py`, and the drawing is true."""

from __future__ import annotations

from pathlib import Path

import art_backend
from art_backend import _errors
from tests.support.error_tree import drawn_tree, exception_classes_defined

BACKEND = Path(art_backend.__file__).parent


def test_every_exception_the_server_defines_is_defined_in_errors():
    elsewhere = {
        name: str(path.relative_to(BACKEND))
        for name, path in exception_classes_defined(BACKEND).items()
        if path.name != "_errors.py"
    }
    assert elsewhere == {}, "define these in art_backend/_errors.py and draw them in its tree"


def test_the_drawing_names_every_class_with_its_parent():
    drawn = drawn_tree(_errors)
    defined = {
        name: value
        for name, value in vars(_errors).items()
        if isinstance(value, type)
        and issubclass(value, Exception)
        and value.__module__ == _errors.__name__
    }
    assert set(drawn) == set(defined)
    for name, parent in drawn.items():
        if parent is None:
            assert not any(base.__name__ in defined for base in defined[name].__bases__), name
        else:
            assert defined[parent] in defined[name].__bases__, f"{name} is drawn under {parent}"


def test_each_class_answers_with_the_status_drawn_beside_it():
    lines = (_errors.__doc__ or "").split("```text", 1)[1].split("```", 1)[0].splitlines()
    for line in lines:
        words = line.replace("│", " ").replace("├──", " ").replace("└──", " ").split()
        if len(words) >= 2 and words[1].isdigit() and words[0] != "RequestBodyTooLarge":
            assert getattr(_errors, words[0]).status_code == int(words[1]), line
            assert getattr(_errors, words[0]).error_type == words[2].rstrip(":"), line


def test_a_subclass_that_states_no_status_keeps_its_parents():
    assert _errors.ContextLengthError.status_code == 400
    assert _errors.UnsafePathError.error_type == "invalid_request_error"
    assert _errors.TrainerStateError.status_code == 409
    assert _errors.EngineStoppedError.error_type == "server_error"
