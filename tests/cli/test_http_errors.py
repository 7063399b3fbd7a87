"""The CLI's commands over HTTP when the server is not there or answers with an error: one line
on stderr that names the URL, exit status 1 (2 for a bad --url), never a traceback. The CLI
runs in a subprocess, as a user runs it; the server is nothing (a free port, an unresolvable
host), a stand-in for a proxy or another server (an error page, HTML where JSON was expected),
or the real `selectivity serve`."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.cli.http import describe
from tests.serving import cli, cli_env, free_port, serving

pytestmark = pytest.mark.slow  # the CLI in subprocesses


def _one_line_error(p: object, status: int) -> str:
    """The stderr of a CLI run that failed as it should: ``status``, one line, no traceback."""
    rc, out, err = p.returncode, p.stdout, p.stderr  # type: ignore[attr-defined]
    assert rc == status, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return str(lines[0])


def test_connection_refused_names_the_url_and_the_fix() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = cli_env()
    for args in (
        ("unlock", "status", "ur_1", "--url", url, "--key", "sk_x"),
        ("unlock", "list", "--url", url, "--key", "sk_x"),
        ("audit", "reidentify", "--url", url, "--key", "sk_x", "--stream", "s",
         "--positive-label", "1", "--release", "count_tables"),
    ):  # fmt: skip
        line = _one_line_error(cli(*args, env=env), 1)
        assert line == (
            f"error: cannot reach {url} (connection refused); is the service running? (make run)"
        ), args
    # SELECTIVITY_URL stands in for --url, and is the one named
    p = cli("unlock", "list", "--key", "sk_x", env=env | {"SELECTIVITY_URL": url})
    assert f"cannot reach {url} (connection refused)" in _one_line_error(p, 1)


def test_unknown_host_and_bad_url() -> None:
    env = cli_env()
    p = cli("unlock", "list", "--url", "http://selectivity.invalid:8000", "--key", "k", env=env)
    line = _one_line_error(p, 1)
    assert line.startswith("error: cannot reach http://selectivity.invalid:8000 (host name"), line
    assert "check --url or SELECTIVITY_URL" in line
    p = cli("unlock", "list", "--url", "ftp://127.0.0.1:1", "--key", "k", env=env)
    assert _one_line_error(p, 2).startswith("error: bad --url 'ftp://127.0.0.1:1'")


class _StandIn(http.server.BaseHTTPRequestHandler):
    """What a proxy or another server may answer: by path, a JSON error in the service's
    shape, an HTML error page, a JSON body that is not the service's, or HTML with a 200."""

    ANSWERS = {
        "/v1/admin/unlock-requests/ur_404": (404, "application/json",
                                             b'{"error": "NotFound", "detail": "no such request"}'),
        "/v1/admin/unlock-requests/ur_502": (502, "text/html",
                                             b"<html><body><h1>502 Bad Gateway</h1></body></html>"),
        "/v1/admin/unlock-requests/ur_list": (500, "application/json", b'["not", "ours"]'),
        "/v1/admin/unlock-requests/ur_html": (200, "text/html", b"<html>hello</html>"),
    }  # fmt: skip

    def do_GET(self) -> None:
        status, kind, body = self.ANSWERS.get(self.path, (404, "text/plain", b""))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@contextlib.contextmanager
def _stand_in() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_error_answers_are_one_line() -> None:
    env = cli_env()
    with _stand_in() as url:

        def status(rid: str) -> str:
            p = cli("unlock", "status", rid, "--url", url, "--key", "k", env=env)
            return _one_line_error(p, 1)

        path = f"{url}/v1/admin/unlock-requests"
        assert status("ur_404") == f"error 404 from GET {path}/ur_404: NotFound: no such request"
        assert status("ur_502") == (
            f"error 502 from GET {path}/ur_502: <html><body><h1>502 Bad Gateway</h1></body></html>"
        )
        assert status("ur_list") == f'error 500 from GET {path}/ur_list: ["not", "ours"]'
        assert status("ur_html") == (
            f"error: GET {path}/ur_html answered 200 with text/html, not JSON; "
            "is --url the selectivity service?"
        )


def test_the_services_own_errors_are_one_line(tmp_path: Path) -> None:
    with serving(tmp_path) as server:
        env, base = server.env, server.base
        p = cli("unlock", "status", "ur_x", "--url", base, "--key", "sk_1_" + "x" * 40, env=env)
        line = _one_line_error(p, 1)
        assert line.startswith(f"error 401 from GET {base}/v1/admin/unlock-requests/ur_x: "), line
        p = cli("unlock", "status", "ur_x", "--url", base, "--key", server.admin_key, env=env)
        line = _one_line_error(p, 1)
        assert line.startswith(f"error 404 from GET {base}/v1/admin/unlock-requests/ur_x: "), line
        server.stop()


def _request(timeout: float = 60.0) -> httpx.Request:
    return httpx.Request("GET", "http://h:1/v1/x", extensions={"timeout": dict.fromkeys(
        ("connect", "read", "write", "pool"), timeout)})  # fmt: skip


def test_timeouts_and_broken_connections_are_described() -> None:
    """What a hung or dying server raises (too slow to provoke in a test: 60 s a timeout)."""
    url = "http://h:1"
    assert describe(httpx.ConnectTimeout("t", request=_request(5)), url) == (
        "error: cannot reach http://h:1 (no connection within 5 s); "
        "is the host up and the port open?",
        1,
    )
    assert describe(httpx.ReadTimeout("t", request=_request()), None) == (
        "error: http://h:1 did not answer within 60 s; the service may be overloaded, try again",
        1,
    )
    line, status = describe(
        httpx.RemoteProtocolError("Server disconnected", request=_request()), url
    )
    assert status == 1 and line.startswith("error: http://h:1 broke off the connection")
    resp = httpx.Response(503, request=_request())
    err = httpx.HTTPStatusError("503", request=resp.request, response=resp)
    assert describe(err, url) == ("error 503 from GET http://h:1/v1/x", 1)
