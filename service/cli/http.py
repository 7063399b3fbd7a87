"""The CLI's HTTP side: the client of the commands that talk to a running service (``unlock``,
``audit reidentify``, ``demo``), the check of its answers, and ``reported_errors``, which
``service.cli.entry.main`` wraps around every command so that an unreachable or misbehaving server
is one line on stderr and an exit status, never a traceback.

Exit statuses: 1 when the server could not be reached or answered with an error (as
``sys.exit(message)`` gives), 2 for a bad ``--url`` (argparse's status for usage errors)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import httpx

SERVER_ERROR = 1
USAGE_ERROR = 2


def http_client(args: argparse.Namespace) -> httpx.Client:
    """An HTTP client for ``--url`` with ``--key`` (or $SELECTIVITY_API_KEY) as the bearer.
    httpx's log of each request is left out: the command's output, or its one error line, is
    what the user reads."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    key = args.key or os.environ.get("SELECTIVITY_API_KEY")
    if not key:
        sys.exit("error: pass --key or set SELECTIVITY_API_KEY")
    return httpx.Client(base_url=args.url, headers={"Authorization": f"Bearer {key}"}, timeout=60.0)


def checked(resp: httpx.Response) -> Any:
    """The JSON body of ``resp``, or exit (status 1) with the service's error and detail, or
    with what came back instead of JSON (a proxy's error page, another server)."""
    where = f"{resp.request.method} {resp.request.url}"
    if resp.status_code >= 400:
        try:
            body = resp.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and ("error" in body or "detail" in body):
            msg = f"{body.get('error')}: {body.get('detail')}"
        else:
            msg = " ".join(resp.text[:200].split()) or resp.reason_phrase
        _exit(f"error {resp.status_code} from {where}: {msg}", SERVER_ERROR)
    try:
        return resp.json()
    except ValueError:
        kind = resp.headers.get("content-type") or "no content type"
        _exit(
            f"error: {where} answered {resp.status_code} with {kind}, not JSON; "
            "is --url the selectivity service?",
            SERVER_ERROR,
        )


def _exit(message: str, status: int) -> NoReturn:
    print(" ".join(message.split()), file=sys.stderr, flush=True)  # one line, whatever it quotes
    raise SystemExit(status)


def _origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode()}"


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of type ``kind`` in ``exc``'s chain (httpx wraps httpcore's, which
    wraps the socket's ``OSError``)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _seconds(exc: httpx.RequestError, which: str) -> str:
    try:
        value = exc.request.extensions.get("timeout", {}).get(which)
    except RuntimeError:  # an error raised without its request
        value = None
    return "the time limit" if value is None else f"{value:g} s"


def describe(exc: httpx.HTTPError | httpx.InvalidURL, url: str | None) -> tuple[str, int]:
    """One line for an HTTP failure, and the exit status. ``url`` is the ``--url`` given (the
    request's origin when None)."""
    if isinstance(exc, httpx.InvalidURL | httpx.UnsupportedProtocol):
        return f"error: bad --url {url!r}: {exc}", USAGE_ERROR
    try:
        request = exc.request
    except RuntimeError:
        request = None
    where = url or (_origin(request.url) if request is not None else "the server")
    if isinstance(exc, httpx.HTTPStatusError):
        r = exc.response
        return f"error {r.status_code} from {r.request.method} {r.request.url}", SERVER_ERROR
    if isinstance(exc, httpx.ConnectTimeout):
        reason = f"no connection within {_seconds(exc, 'connect')}"
        hint = "is the host up and the port open?"
    elif isinstance(exc, httpx.ConnectError):
        if _cause(exc, ConnectionRefusedError) is not None:
            reason, hint = "connection refused", "is the service running? (make run)"
        elif _cause(exc, socket.gaierror) is not None:
            host = request.url.host if request is not None else where
            reason, hint = f"host name {host!r} not found", "check --url or SELECTIVITY_URL"
        else:
            os_error = _cause(exc, OSError)
            reason = getattr(os_error, "strerror", None) or str(exc) or type(exc).__name__
            hint = "is the service running? (make run)"
    elif isinstance(exc, httpx.TimeoutException):
        which = {httpx.WriteTimeout: "write", httpx.PoolTimeout: "pool"}.get(type(exc), "read")
        return (
            f"error: {where} did not answer within {_seconds(exc, which)}; "
            "the service may be overloaded, try again",
            SERVER_ERROR,
        )
    elif isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return (
            f"error: {where} broke off the connection ({str(exc) or type(exc).__name__}); "
            "is the service still running, and is --url the selectivity service?",
            SERVER_ERROR,
        )
    else:
        reason = str(exc) or type(exc).__name__
        hint = "is the service running? (make run)"
    return f"error: cannot reach {where} ({reason}); {hint}", SERVER_ERROR


@contextmanager
def reported_errors(url: str | None = None) -> Iterator[None]:
    """Run a command; an HTTP failure that escapes it becomes one line on stderr and its exit
    status (``describe``), not a traceback. ``url`` is the command's ``--url``, if it has one."""
    try:
        yield
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        message, status = describe(exc, url)
        _exit(message, status)
