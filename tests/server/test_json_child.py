"""Bodies of millions of escapes are parsed in a child process (`art_backend._json_child`): the
same values and the same failures as `json.loads` here, and a child that dies is replaced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from art_backend import _json_child
from art_backend._errors import InvalidRequestError
from art_backend._limits import parse_json_object

BODIES = {
    "escapes": b'{"a": "\\"quoted\\"\\n\\t\\\\ and \\u00e9", "b": [1, 2.5, null, true]}',
    "a surrogate pair": b'{"emoji": "\\ud83d\\ude00", "key \\u2028": {"nested": ["\\\\"]}}',
}
BAD = {
    "not JSON": b'{"a": "\\"unterminated}',
    "a long number": b'{"a": "\\\\", "n": ' + b"9" * 5000 + b"}",
    "not UTF-8": b'{"a": "\\\\ \xff"}',
    "too deep": b'{"a": "\\\\", "b": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.fixture
def child(monkeypatch: pytest.MonkeyPatch):
    """Every body with a backslash goes to the child."""
    monkeypatch.setattr(_json_child, "ESCAPES_FOR_A_CHILD", 0)
    yield _json_child._child
    _json_child._child.stop()


@pytest.mark.parametrize("name", BODIES)
def test_the_child_parses_what_json_loads_parses(child, name: str):
    parsed = _json_child.loads(BODIES[name])
    assert parsed == json.loads(BODIES[name])
    assert child._process is not None and child._process.poll() is None  # it ran there


@pytest.mark.parametrize("name", BAD)
def test_the_child_fails_as_json_loads_fails(child, name: str):
    with pytest.raises(Exception) as here:
        json.loads(BAD[name])
    with pytest.raises(type(here.value)) as there:
        _json_child.loads(BAD[name])
    assert str(there.value) == str(here.value)
    assert child._process is not None


def test_the_request_errors_are_the_same_from_the_child(monkeypatch: pytest.MonkeyPatch):
    """parse_json_object's 400s read the same whichever process parsed the body."""
    answers = []
    for threshold in (10**9, 0):
        monkeypatch.setattr(_json_child, "ESCAPES_FOR_A_CHILD", threshold)
        with pytest.raises(InvalidRequestError) as error:
            parse_json_object(BAD["not JSON"])
        answers.append(str(error.value))
    _json_child._child.stop()
    assert answers[0] == answers[1] and "not valid JSON" in answers[0]


def test_a_killed_child_is_replaced_and_a_child_dying_mid_body_falls_back_here(child):
    body = BODIES["escapes"]
    assert _json_child.loads(body) == json.loads(body)
    first = child._process
    first.kill()
    first.wait()
    assert _json_child.loads(body) == json.loads(body)  # a fresh child
    assert child._process is not first
    # A child that dies while it holds the body (this one exits after the length): the body is
    # parsed here instead.
    child.stop()
    child._process = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.buffer.read(8)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert _json_child.loads(body) == json.loads(body)
    assert child._process is None  # stopped; the next body starts a fresh one
