"""The review page behind --api-key: Bearer for API clients, a key login and cookie for browsers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from art_backend._auth import SESSION_COOKIE
from tests.support.review_data import MODEL, PROJECT, start_review_server, write_review_store
from tests.support.servers import RunningServer

KEY = "secret-key"  # keyed_server's


@pytest.fixture(scope="module")
def keyed_review(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`art review --api-key` over a written store."""
    root = tmp_path_factory.mktemp("review-keyed")
    write_review_store(root)
    server, thread, url = start_review_server(root, api_key=KEY)
    yield url
    server.should_exit = True
    thread.join(10)


@pytest.fixture(params=["art-server", "art-review"])
def url(request: pytest.FixtureRequest) -> str:
    """The review page of a running art-server with a key, and of `art review` with a key."""
    if request.param == "art-server":
        server: RunningServer = request.getfixturevalue("keyed_server")
        write_review_store(Path(server.art_path))
        return server.url
    return request.getfixturevalue("keyed_review")


def test_without_the_key_the_page_is_401_with_a_login_form(url: str):
    page = httpx.get(f"{url}/review/{PROJECT}/{MODEL}/")
    assert page.status_code == 401
    assert '<form method="post" action="/review/login">' in page.text
    assert f'name="next" value="/review/{PROJECT}/{MODEL}/"' in page.text
    post = httpx.post(
        f"{url}/review/{PROJECT}/{MODEL}/steps/train/0/decisions",
        data={"action": "flag_trajectory", "trajectory_id": "t0-a", "reason": "r"},
    )
    assert post.status_code == 401


def test_the_bearer_header_opens_it(url: str):
    page = httpx.get(f"{url}/review/", headers={"Authorization": f"Bearer {KEY}"})
    assert page.status_code == 200 and f"{PROJECT}/{MODEL}" in page.text
    wrong = httpx.get(f"{url}/review/", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_a_key_link_sets_an_httponly_cookie_that_opens_the_pages(url: str):
    with httpx.Client(base_url=url) as browser:
        login = browser.get(f"/review/{PROJECT}/{MODEL}/steps/train/0?key={KEY}&min_reward=0.5")
        assert login.status_code == 303
        # The key leaves the URL; the other parameters stay.
        assert (
            login.headers["location"] == f"/review/{PROJECT}/{MODEL}/steps/train/0?min_reward=0.5"
        )
        cookie = login.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}=") and "HttpOnly" in cookie
        assert "Path=/review" in cookie and "samesite=lax" in cookie.lower()
        assert KEY not in cookie  # a token derived from the key, not the key
        assert browser.get(f"/review/{PROJECT}/{MODEL}/").status_code == 200
        # The cookie opens the review page only: the API still needs the header.
        assert browser.get("/v1/models").status_code in (401, 404)


def test_the_login_form_posts_the_key(url: str):
    with httpx.Client(base_url=url) as browser:
        wrong = browser.post("/review/login", data={"key": "nope", "next": "/review/"})
        assert wrong.status_code == 401 and "not the server" in wrong.text
        login = browser.post(
            "/review/login", data={"key": KEY, "next": f"/review/{PROJECT}/{MODEL}/"}
        )
        assert login.status_code == 303
        assert login.headers["location"] == f"/review/{PROJECT}/{MODEL}/"
        assert browser.get(login.headers["location"]).status_code == 200
        outside = browser.post("/review/login", data={"key": KEY, "next": "https://evil.example"})
        assert outside.headers["location"] == "/review/"


def test_a_wrong_key_link_is_401(url: str):
    page = httpx.get(f"{url}/review/?key=nope")
    assert page.status_code == 401 and "not the server" in page.text
    forged = httpx.get(f"{url}/review/", cookies={SESSION_COOKIE: "forged"})
    assert forged.status_code == 401
