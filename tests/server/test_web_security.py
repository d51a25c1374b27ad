"""A web page cannot drive the server: Host allow-list, cross-origin refusal, CSRF, no key leaks.

The attacks are the ones a browser on the user's machine can make against a loopback server:
a cross-site "simple" POST (a form, or `fetch` with `text/plain`: no CORS preflight), DNS
rebinding (the attacker's name re-resolved to 127.0.0.1, so the request carries
`Host: evil.example`), and a form that rides on the review page's login cookie.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest

import art_core as art
from art_backend._auth import SESSION_COOKIE
from art_backend._log_redaction import RedactSecretsFilter, redact_path, redact_text
from tests.support.review_data import MODEL, PROJECT, write_review_store
from tests.support.servers import RunningServer, free_port, serve_in_thread

EVIL = "http://evil.example"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
KEY = "secret-key"  # keyed_server's
STEP0 = f"/review/{PROJECT}/{MODEL}/steps/train/0"


@pytest.fixture(params=["no key", "key"])
def running(request: pytest.FixtureRequest) -> RunningServer:
    """The tiny model's art-server, without and with an API key."""
    return request.getfixturevalue("server" if request.param == "no key" else "keyed_server")


def requests_served(server: RunningServer) -> float:
    return server.metrics()["art_requests_total"]


def rebound(url: str) -> str:
    """The Host a DNS-rebinding page sends: its own name, the server's port."""
    return f"evil.example:{urlsplit(url).port}"


def decisions(root: Path) -> str:
    log = root / PROJECT / "models" / MODEL / "review" / "decisions.jsonl"
    return log.read_text() if log.exists() else ""


# ------------------------------------------------------------------------ cross-site requests


def test_a_cross_site_simple_post_is_refused_and_serves_no_completion(running: RunningServer):
    before = requests_served(running)
    answer = httpx.post(
        f"{running.url}/v1/chat/completions",
        content=json.dumps(CHAT),
        headers={"Origin": EVIL, "Content-Type": "text/plain", **running.headers()},
        timeout=60,
    )
    assert answer.status_code == 403
    error = answer.json()["error"]
    assert error["type"] == "permission_error" and error["code"] == "cross_origin_request"
    assert "another site" in error["message"] and EVIL in error["message"]
    assert requests_served(running) == before


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "null"},  # a sandboxed frame or a file:// page
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # a page on another port of this host, Origin hidden
        {"Origin": "http://127.0.0.1:1"},  # same host, another port: another origin
        {"Origin": "http://localhost"},  # another origin for a server on 127.0.0.1:PORT
    ],
    ids=["origin-null", "cross-site", "same-site", "other-port", "other-name"],
)
def test_every_browser_label_of_another_origin_is_refused(server: RunningServer, headers):
    before = requests_served(server)
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=headers)
    assert answer.status_code == 403 and "another site" in answer.json()["error"]["message"]
    assert requests_served(server) == before


def test_a_cross_site_post_is_refused_on_every_state_changing_route(running: RunningServer):
    for method, path in [
        ("POST", "/v1/training/models"),
        ("POST", "/v1/adapters"),
        ("DELETE", "/v1/rollouts/r-1"),
        ("POST", f"{STEP0}/decisions"),
    ]:
        answer = httpx.request(
            method, f"{running.url}{path}", headers={"Origin": EVIL, **running.headers()}
        )
        assert answer.status_code == 403, (method, path, answer.text)


def test_same_origin_and_non_browser_clients_keep_working(running: RunningServer):
    same_origin = httpx.post(
        f"{running.url}/v1/chat/completions",
        json=CHAT,
        headers={"Origin": running.url, "Sec-Fetch-Site": "same-origin", **running.headers()},
        timeout=60,
    )
    assert same_origin.status_code == 200
    # The openai SDK sends no Origin: it is not a browser, nothing to refuse.
    sdk = openai.OpenAI(base_url=f"{running.url}/v1", api_key=running.api_key or "unused")
    answer = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert answer.choices[0].message is not None
    # A GET from another site is not refused here: the browser does not let that page read it.
    assert httpx.get(f"{running.url}/health", headers={"Origin": EVIL}).status_code == 200


# ------------------------------------------------------------------------------ DNS rebinding


def test_dns_rebinding_is_refused_on_every_route(running: RunningServer):
    host = {"Host": rebound(running.url), **running.headers()}
    body = {"project": "web", "name": "rebound", "base_model": "tiny"}
    for answer in [
        httpx.post(f"{running.url}/v1/training/models", json=body, headers=host),
        httpx.get(f"{running.url}/v1/training/models/web/rebound/history", headers=host),
        httpx.get(f"{running.url}/review/", headers=host),
        httpx.post(f"{running.url}/v1/chat/completions", json=CHAT, headers=host),
    ]:
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "host_not_allowed"
        assert "--allowed-hosts evil.example" in error["message"]
    assert not (Path(running.art_path) / "web" / "models" / "rebound").exists()
    # The Tinker API's routes answer in its SDK's shape.
    tinker = httpx.post(f"{running.url}/api/v1/create_session", json={}, headers=host)
    assert tinker.status_code == 400
    assert "--allowed-hosts evil.example" in tinker.json()["detail"]


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST.", "127.0.0.1", "[::1]", "review.localhost", "10.1.2.3"]
)
def test_local_names_and_ip_addresses_are_answered(server: RunningServer, host: str):
    port = urlsplit(server.url).port
    answer = httpx.get(f"{server.url}/v1/models", headers={"Host": f"{host}:{port}"})
    assert answer.status_code == 200
    same_origin = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=CHAT,
        headers={"Host": f"{host}:{port}", "Origin": f"http://{host}:{port}"},
        timeout=60,
    )
    assert same_origin.status_code == 200


@pytest.fixture(scope="module")
def named_review(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`art review`'s app with --allowed-hosts review.internal (no key)."""
    from art_backend.review.cli import build_review_server

    root = tmp_path_factory.mktemp("review-named")
    write_review_store(root)
    server, thread, url = serve_in_thread(
        build_review_server(root, allowed_hosts=["review.internal"])
    )
    yield url, root
    server.should_exit = True
    thread.join(10)


def test_allowed_hosts_lets_a_named_host_in(named_review: tuple[str, Path]):
    url, root = named_review
    port = urlsplit(url).port
    named = {"Host": f"review.internal:{port}"}
    assert httpx.get(f"{url}/review/", headers=named).status_code == 200
    form = {"action": "flag_trajectory", "trajectory_id": "t0-a", "reason": "from the page"}
    posted = httpx.post(
        f"{url}{STEP0}/decisions",
        data=form,
        headers={**named, "Origin": f"http://review.internal:{port}"},
    )
    assert posted.status_code == 303 and "from the page" in decisions(root)
    # Still: other names, and posts from other sites.
    assert httpx.get(f"{url}/review/", headers={"Host": rebound(url)}).status_code == 400
    crossed = httpx.post(f"{url}{STEP0}/decisions", data=form, headers={"Origin": EVIL})
    assert crossed.status_code == 403


def test_allowed_hosts_star_answers_any_name(tmp_path: Path):
    from art_backend.review.cli import build_review_server

    write_review_store(tmp_path)
    server, thread, url = serve_in_thread(build_review_server(tmp_path, allowed_hosts=["*"]))
    try:
        assert httpx.get(f"{url}/review/", headers={"Host": rebound(url)}).status_code == 200
        # `*` opens Host names only: a post from another site is still refused.
        crossed = httpx.post(f"{url}{STEP0}/decisions", data={}, headers={"Origin": EVIL})
        assert crossed.status_code == 403
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module", params=["no key", "key"])
def review_as_its_command_builds_it(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """`art review`'s app with its own --host in the allow-list, as the command adds it, and a
    listed name; without and with a key (the headers a key-holding client sends)."""
    from art_backend.review.cli import build_review_server

    root = tmp_path_factory.mktemp("review-origins")
    write_review_store(root)
    key = KEY if request.param == "key" else None
    app = build_review_server(root, api_key=key, allowed_hosts=["127.0.0.1", "review.internal"])
    server, thread, url = serve_in_thread(app)
    yield url, ({"Authorization": f"Bearer {KEY}"} if key else {})
    server.should_exit = True
    thread.join(10)


def test_same_origin_means_same_scheme_host_and_port_whatever_the_allow_list_names(
    review_as_its_command_builds_it: tuple[str, dict[str, str]],
):
    """A page on another port or scheme of the server's own address is another origin, even when
    that address is --host or listed in --allowed-hosts (those decide only the Host check)."""
    url, auth = review_as_its_command_builds_it
    port = urlsplit(url).port
    other_port = free_port()
    form = {"action": "flag_trajectory", "trajectory_id": "t0-a", "reason": "origin matrix"}
    outcomes = {}
    for host in ["127.0.0.1", "review.internal"]:
        for scheme in ["http", "https"]:
            for origin_host in ["127.0.0.1", "localhost", "review.internal", "evil.example"]:
                for origin_port in [f":{port}", f":{other_port}", ""]:
                    origin = f"{scheme}://{origin_host}{origin_port}"
                    headers = {"Host": f"{host}:{port}", "Origin": origin, **auth}
                    answer = httpx.post(f"{url}{STEP0}/decisions", data=form, headers=headers)
                    outcomes[(host, origin)] = answer.status_code
    allowed = {key for key, status in outcomes.items() if status != 403}
    assert allowed == {("127.0.0.1", f"http://127.0.0.1:{port}"),
                       ("review.internal", f"http://review.internal:{port}")}  # fmt: skip
    assert all(status == 303 for key, status in outcomes.items() if key in allowed)


# ----------------------------------------------------------------------------- review: CSRF


@pytest.fixture
def keyed_review(keyed_server: RunningServer) -> Iterator[tuple[httpx.Client, Path]]:
    """A browser-like client logged in to the keyed art-server's review page (cookie)."""
    root = Path(keyed_server.art_path)
    write_review_store(root)
    with httpx.Client(base_url=keyed_server.url, timeout=30) as browser:
        login = browser.post("/review/login", data={"key": KEY, "next": "/review/"})
        assert login.status_code == 303 and SESSION_COOKIE in browser.cookies
        yield browser, root


def token_on(page: str) -> str:
    marker = 'name="csrf_token" value="'
    assert marker in page, "the page's forms carry no CSRF token"
    return page.split(marker, 1)[1].split('"', 1)[0]


def test_a_cookie_session_posts_only_with_the_pages_token(
    keyed_review: tuple[httpx.Client, Path],
):
    browser, root = keyed_review
    page = browser.get(f"{STEP0}/groups/0").text
    token = token_on(page)
    assert page.count(f'value="{token}"') == page.count('method="post"')  # every form has it
    assert KEY not in page
    form = {"action": "flag_trajectory", "trajectory_id": "t0-a"}
    before = decisions(root)
    for forged in [{}, {"csrf_token": ""}, {"csrf_token": "0" * 64}]:
        answer = browser.post(f"{STEP0}/decisions", data={**form, "reason": "forged", **forged})
        assert answer.status_code == 403 and "token" in answer.text
    assert decisions(root) == before
    posted = browser.post(
        f"{STEP0}/decisions", data={**form, "reason": "with the token", "csrf_token": token}
    )
    assert posted.status_code == 303 and "with the token" in decisions(root)
    assert "csrf" not in decisions(root)  # the token is not stored with the decision


def test_the_approve_form_carries_the_token_too(keyed_review: tuple[httpx.Client, Path]):
    browser, _ = keyed_review
    answer = browser.post(
        f"/review/{PROJECT}/{MODEL}/pending/abcdefabcdef/approve",
        data={},
        headers={"Accept": "application/json"},
    )
    assert answer.status_code == 403
    assert answer.json()["error"]["type"] == "permission_error"


def test_api_clients_with_the_key_need_no_token(keyed_server: RunningServer):
    root = Path(keyed_server.art_path)
    write_review_store(root)
    answer = httpx.post(
        f"{keyed_server.url}{STEP0}/decisions",
        data={"action": "flag_trajectory", "trajectory_id": "t0-a", "reason": "by the API"},
        headers={**keyed_server.headers(), "Accept": "application/json"},
    )
    assert answer.status_code == 200 and answer.json()["decision"]["reason"] == "by the API"
    page = httpx.get(f"{keyed_server.url}{STEP0}/groups/0", headers=keyed_server.headers())
    assert 'name="csrf_token"' not in page.text  # no cookie, nothing to forge


def test_the_session_cookie_is_httponly_samesite_and_not_the_key(keyed_server: RunningServer):
    login = httpx.post(f"{keyed_server.url}/review/login", data={"key": KEY, "next": "/review/"})
    cookie = login.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and "path=/review" in cookie
    assert KEY not in login.headers["set-cookie"]


def test_without_a_key_the_forms_need_no_token(named_review: tuple[str, Path]):
    url, _ = named_review
    assert 'name="csrf_token"' not in httpx.get(f"{url}{STEP0}/groups/0").text


# ------------------------------------------------------------------------------- key exposure


async def test_local_backend_passes_the_key_in_the_environment_not_the_command_line(
    tiny_model_dir: Path, tmp_path: Path
):
    backend = art.LocalBackend(path=tmp_path, dtype="float32")
    try:
        model = art.TrainableModel(name="m", project="web", base_model=str(tiny_model_dir))
        await model.register(backend)  # starts the child; registering needs the key
        assert backend.process is not None
        pid = backend.process.pid
        key = backend._api_key
        assert key
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert not any(key.encode() in part for part in command_line)
        assert b"--api-key" not in command_line
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"ART_API_KEY={key}".encode() in environment  # readable by this user only
        assert httpx.get(f"{backend.base_url}/v1/models").status_code == 401
    finally:
        await backend.close()


def test_access_log_redacts_key_like_query_values():
    assert redact_path("/review/?key=s3cret&min_reward=0.5") == (
        "/review/?key=REDACTED&min_reward=0.5"
    )
    assert redact_path("/v1/models?API_KEY=s3cret&token=t") == (
        "/v1/models?API_KEY=REDACTED&token=REDACTED"
    )
    assert redact_path("/review/?min_reward=0.5") == "/review/?min_reward=0.5"
    nested = redact_path("/review/?next=/review/%253Fapi_key%253Ds3cret&q=1")  # encoded twice
    assert "s3cret" not in nested and nested.endswith("?next=REDACTED&q=1")
    assert "s3cret" not in redact_text("GET /x?api_key=s3cret HTTP/1.1")
    assert "s3cret" not in redact_text("headers: {'authorization': 'Bearer s3cret'}")
    assert "s3cret" not in redact_text("Authorization: Basic s3cret")


def test_the_filter_rewrites_a_real_uvicorn_access_record(caplog: pytest.LogCaptureFixture):
    logger = logging.getLogger("uvicorn.access")
    redactor = RedactSecretsFilter()
    logger.addFilter(redactor)
    propagate, logger.propagate = logger.propagate, True
    try:
        with caplog.at_level(logging.INFO, logger="uvicorn.access"):
            logger.info(
                '%s - "%s %s HTTP/%s" %d',
                "127.0.0.1:5000",
                "GET",
                "/review/?key=s3cret&q=bags",
                "1.1",
                303,
            )
    finally:
        logger.removeFilter(redactor)
        logger.propagate = propagate
    assert set(caplog.messages) == {
        '127.0.0.1:5000 - "GET /review/?key=REDACTED&q=bags HTTP/1.1" 303'
    }


def wait_healthy(process: subprocess.Popen[str], url: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"the server exited early:\n{process.stdout and process.stdout.read()}"
            )
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not become healthy")
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("program", "log_level"),
    [("art-server", "info"), ("art review", "info"), ("art review", "trace")],
)
def test_the_entry_points_take_allowed_hosts_and_log_no_key(
    program: str, log_level: str, tiny_model_dir: Path, tmp_path: Path
):
    """Also at uvicorn's `trace` level (it logs each request's ASGI scope: headers, query)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    common = ["--port", str(port), "--path", str(tmp_path), "--log-level", log_level]
    common += ["--allowed-hosts", "box.lan, other.lan"]
    model = ["--model", str(tiny_model_dir), "--name", "tiny", "--dtype", "float32"]
    command = (
        ["-m", "art_backend.cli", *model, *common]
        if program == "art-server"
        else ["-m", "art_backend.review.cli", *common]
    )
    env = {**os.environ, "ART_API_KEY": "key-in-env", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        wait_healthy(process, url)
        named = {"Host": f"box.lan:{port}"}
        assert httpx.get(f"{url}/review/?key=key-in-env", headers=named).status_code == 303
        assert httpx.get(f"{url}/review/?api_key=wrong-key", headers=named).status_code == 401
        rebinding = httpx.get(f"{url}/review/", headers={"Host": rebound(url)})
        assert rebinding.status_code == 400
        # A page on another port of the bind address (which the command lists as a host name)
        # is another origin, even with the key's help.
        path = "/v1/training/models" if program == "art-server" else f"{STEP0}/decisions"
        crossed = httpx.post(
            f"{url}{path}",
            content=b'{"project": "p", "name": "x", "base_model": "tiny"}',
            headers={"Origin": f"http://127.0.0.1:{free_port()}", "Sec-Fetch-Site": "same-site",
                     "Content-Type": "text/plain", "Authorization": "Bearer key-in-env"},
        )  # fmt: skip
        assert crossed.status_code == 403, crossed.text
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=60)
    assert "/review/?key=REDACTED" in output and "/review/?api_key=REDACTED" in output
    assert "key-in-env" not in output and "wrong-key" not in output


def test_a_host_port_of_other_digits_is_no_port_not_a_500(server: RunningServer):
    """`str.isdigit` takes "²": the port of `127.0.0.1:²` was read with int() (a 500)."""
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=CHAT,
        headers={"Host": "127.0.0.1:²".encode("latin-1"), "Origin": "http://127.0.0.1:2"},
    )
    assert response.status_code == 403, response.text


def test_the_login_page_shows_no_secret_from_the_link_it_was_opened_with(
    keyed_server: RunningServer,
):
    """The page's form carries where to go after login: without `api_key=`/`token=` values
    (a link with them would put the secret into the page and the browser's history)."""
    page = httpx.get(
        f"{keyed_server.url}/review/",
        params={"api_key": "leaked-1", "token": "leaked-2", "Access_Token": "leaked-3", "q": "ok"},
    )
    assert page.status_code == 401
    assert "leaked" not in page.text
    assert 'value="/review/?q=ok"' in page.text


# A key nested in another value (the login's `next`, a `next` in a `next`), at any depth of URL
# encoding: (the query, where the login sends the browser once the key is given).
NESTED_SECRETS = [
    ("next=/review/%3Fapi_key%3Dleaked-1", "/review/"),
    ("next=%2Freview%2F%253Fapi_key%253Dleaked-2", "/review/"),  # encoded twice
    ("q=ok&next=/review/%3Fq%3D1%26Token%3Dleaked-3", "/review/?q=ok"),
    ("next=/review/%3Fnext%3D%252Freview%252F%253Fkey%253Dleaked-4", "/review/"),
    ("api%255Fkey=leaked-5", "/review/"),  # the name itself encoded
]


@pytest.mark.parametrize(("query", "after_login"), NESTED_SECRETS)
def test_a_key_nested_in_a_link_is_never_shown_or_sent_back(
    keyed_server: RunningServer, query: str, after_login: str
):
    """`/review/?next=/review/%3Fapi_key%3DKEY` showed the key in the login page's form."""
    page = httpx.get(f"{keyed_server.url}/review/?{query}")
    assert page.status_code == 401 and "leaked" not in page.text
    assert f'name="next" value="{after_login}"' in page.text
    logged_in = httpx.get(f"{keyed_server.url}/review/?{query}&key={KEY}")
    assert logged_in.status_code == 303 and logged_in.headers["location"] == after_login


@pytest.mark.parametrize(
    "next_path",
    ["/review/?api_key=leaked", "/review/%3Fapi_key%3Dleaked", "/review/x?q=%2526token%253Dleaked",
     "/reviewer/", "//evil.example/review/", "/review/\t/evil.example", "/review/login"],
)  # fmt: skip
def test_the_page_after_a_login_or_a_decision_is_a_review_path_without_a_secret(
    keyed_server: RunningServer, next_path: str
):
    url = keyed_server.url
    refused = httpx.post(f"{url}/review/login", data={"key": "wrong", "next": next_path})
    assert refused.status_code == 401 and "leaked" not in refused.text
    assert 'name="next" value="/review/"' in refused.text
    login = httpx.post(f"{url}/review/login", data={"key": KEY, "next": next_path})
    assert login.status_code == 303 and login.headers["location"] == "/review/"
    write_review_store(Path(keyed_server.art_path))
    form = {"action": "flag_trajectory", "trajectory_id": "t0-a", "reason": "r", "next": next_path}
    decided = httpx.post(f"{url}{STEP0}/decisions", data=form, headers=keyed_server.headers())
    assert decided.status_code == 303 and decided.headers["location"] == "/review/"
