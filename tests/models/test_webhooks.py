"""Webhook targets (SSRF, issue 13 item 10): internal addresses are refused at registration
and at delivery (resolved again each time), redirects are not followed, and the operator's
allowlist admits chosen internal targets."""

from __future__ import annotations

import ipaddress
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from service.config import Settings
from service.models import repository
from service.models.webhooks import Allowlist, WebhookRefused, check, pinned, why_internal
from tests.conftest import Api, Backend, Jobs
from tests.helpers import new_stream
from tests.models.test_models import Receiver


def _allow(api: Api, allow: str) -> None:
    api.ctx.settings = api.ctx.settings.model_copy(
        update={"webhook_allow": allow, "webhook_backoff_seconds": 0.01, "webhook_attempts": 2}
    )


async def _register(api: Api, name: str, url: str, model: str = "m") -> Any:
    return await api.post(
        f"/v1/streams/{name}/models", role="model", json={"name": model, "webhook_url": url}
    )


async def _trained_model_rolls(api: Api, jobs: Jobs, name: str, mid: str) -> list[Any]:
    """The model trained on the open epoch, the stream rolled (a retrain event for it), the
    follow-ups run: its delivery attempts."""
    epoch = await api.ctx.stores.windows.epoch(name)
    r = await api.post(
        f"/v1/streams/{name}/models/{mid}/trained", role="model", json={"epoch": epoch}
    )
    assert r.status_code == 200, r.text
    assert (await api.post(f"/v1/streams/{name}/roll")).status_code == 200
    await jobs()
    async with api.ctx.sessionmaker() as session:
        return list(await repository.deliveries(session, mid))


_REFUSING: dict[str, str] = {}


@pytest.fixture
async def refusing_stream(api: Api, backend: Backend) -> str:
    """One stream per backend (and process) for the registrations refused below: a refused
    registration stores nothing, so they can share it rather than create one each."""
    if backend.name not in _REFUSING:
        _REFUSING[backend.name] = await new_stream(api, "hook")
    return _REFUSING[backend.name]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:8080/hook", "loopback"),
        ("http://127.1.2.3/hook", "loopback"),
        ("http://[::1]:9000/hook", "loopback"),
        ("http://localhost:8080/hook", "loopback"),  # a host name resolving to loopback
        ("http://10.1.2.3/hook", "private"),
        ("http://192.168.0.1/hook", "private"),
        ("http://172.16.5.4/hook", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),  # cloud metadata
        ("http://[fe80::1]/hook", "link-local"),
        ("http://[fd00::1]/hook", "private"),  # unique-local
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),  # IPv4-mapped
        ("http://[::ffff:169.254.169.254]/hook", "link-local"),
        ("http://[2002:a00:1::]/hook", "private"),  # 6to4 of 10.0.0.1
        ("http://0.0.0.0:8080/hook", "unspecified"),
        ("http://[::]/hook", "unspecified"),
        ("http://224.0.0.1/hook", "multicast"),
        ("http://240.0.0.1/hook", "reserved"),
        ("http://100.64.0.1/hook", "not a public"),  # shared address space (CGNAT)
        ("http://no-such-host.invalid/hook", "does not resolve"),
    ],
)
async def test_registration_refuses_internal_targets(
    api: Api, refusing_stream: str, url: str, why: str
) -> None:
    r = await _register(api, refusing_stream, url)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("webhook_url: refused") and why in detail, detail
    assert "SELECTIVITY_WEBHOOK_ALLOW" in detail or why == "does not resolve"


async def test_registration_accepts_public_and_allowed_targets(api: Api) -> None:
    name = await new_stream(api, "hook")
    assert (await _register(api, name, "https://93.184.215.14/hook", "pub")).status_code == 201
    _allow(api, "127.0.0.0/8, fd00::/8 ,hooks.internal,localhost")
    for i, url in enumerate(["http://127.0.0.1:1/h", "http://[fd00::5]/h", "http://localhost:1/h"]):
        r = await _register(api, name, url, f"m{i}")
        assert r.status_code == 201, r.text
    # the allowlist admits what it names, nothing more
    r = await _register(api, name, "http://10.0.0.1/h", "m9")
    assert r.status_code == 422 and "private" in r.json()["detail"]


async def test_delivery_refuses_a_target_no_longer_allowed(api: Api, jobs: Jobs) -> None:
    """Registered while allowed (as if DNS pointed elsewhere then); at delivery the host
    resolves to loopback, not allowed any more: nothing is sent, the refusal is recorded."""
    receiver = Receiver()
    try:
        _allow(api, "localhost")
        name = await new_stream(api, "hook", retrain_grace_seconds=0)
        port = receiver.server.server_address[1]
        r = await _register(api, name, f"http://localhost:{port}/hook")
        assert r.status_code == 201, r.text
        _allow(api, "")
        tries = await _trained_model_rolls(api, jobs, name, r.json()["id"])
        assert receiver.calls == []
        assert len(tries) == 1 and tries[0].status_code is None
        assert tries[0].error.startswith("refused: its host is (or resolves to) a loopback")
    finally:
        receiver.close()


async def test_delivery_to_an_allowed_host_name_goes_to_the_checked_address(
    api: Api, jobs: Jobs
) -> None:
    receiver = Receiver()
    try:
        _allow(api, "localhost")
        name = await new_stream(api, "hook", retrain_grace_seconds=0)
        port = receiver.server.server_address[1]
        r = await _register(api, name, f"http://localhost:{port}/hook")
        tries = await _trained_model_rolls(api, jobs, name, r.json()["id"])
        assert [(t.attempt, t.status_code) for t in tries] == [(1, 204)]
        assert len(receiver.calls) == 1
        assert receiver.calls[0][0]["host"] == f"localhost:{port}"  # the original Host
    finally:
        receiver.close()


class _Redirector:
    """Answers every POST with a 307 to ``location``."""

    def __init__(self, location: str) -> None:
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.calls += 1
                self.send_response(307)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_delivery_does_not_follow_redirects(api: Api, jobs: Jobs) -> None:
    internal = Receiver()  # the internal service a redirect would reach
    redirector = _Redirector(internal.url)
    try:
        _allow(api, "127.0.0.1/32")
        name = await new_stream(api, "hook", retrain_grace_seconds=0)
        r = await _register(api, name, redirector.url)
        assert r.status_code == 201, r.text
        tries = await _trained_model_rolls(api, jobs, name, r.json()["id"])
        assert [t.status_code for t in tries] == [307, 307]  # a failed attempt, retried
        assert redirector.calls == 2 and internal.calls == []
    finally:
        redirector.close()
        internal.close()


@pytest.mark.parametrize(
    ("address", "internal"),
    [
        ("8.8.8.8", False),
        ("2606:4700:4700::1111", False),
        ("::ffff:8.8.8.8", False),
        ("127.0.0.1", True),
        ("::ffff:10.0.0.1", True),
        ("fec0::1", True),  # site-local (deprecated)
        ("255.255.255.255", True),
        ("192.0.2.1", True),  # documentation
        ("198.18.0.1", True),  # benchmarking
    ],
)
def test_why_internal(address: str, internal: bool) -> None:
    assert (why_internal(ipaddress.ip_address(address)) is not None) == internal


async def test_check_answers_every_checked_address() -> None:
    assert await check("http://8.8.8.8/x", Allowlist()) == [ipaddress.ip_address("8.8.8.8")]
    with pytest.raises(WebhookRefused, match="http or https"):
        await check("ftp://8.8.8.8/x", Allowlist())


def test_allowlist_setting_is_validated() -> None:
    assert Settings(webhook_allow="10.0.0.0/8, hooks.internal").webhook_allow
    with pytest.raises(ValueError, match="WEBHOOK_ALLOW"):
        Settings(webhook_allow="10.0.0.0/33")
    with pytest.raises(ValueError, match="WEBHOOK_ALLOW"):
        Settings(webhook_allow="http://x/")


def test_pinned_request_keeps_the_host_name_for_host_and_tls() -> None:
    target, host, ext = pinned(
        "https://hooks.example.com:8443/h?x=1", ipaddress.ip_address("203.0.113.9")
    )
    assert target == "https://203.0.113.9:8443/h?x=1"
    assert host == {"Host": "hooks.example.com:8443"}
    assert ext == {"sni_hostname": "hooks.example.com"}  # the certificate checked for the name
    target, host, ext = pinned("http://h.example/", ipaddress.ip_address("2001:db8::1"))
    assert target == "http://[2001:db8::1]/" and host == {"Host": "h.example"} and ext == {}
