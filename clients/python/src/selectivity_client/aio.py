"""``AsyncClient``: ``Client``'s methods as coroutines (``events`` an async iterator)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pyarrow as pa

from selectivity_client import _core
from selectivity_client._core import Event, IngestResult
from selectivity_client.client import CONNECT_ERRORS, USER_AGENT, _Settings
from selectivity_client.errors import PayloadTooLarge, Unavailable, from_response


class AsyncClient:
    """``Client`` for asyncio: the same arguments, methods and errors (see ``Client``)."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        stream: str | None = None,
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.5,
        batch_size: int = _core.DEFAULT_BATCH,
        output: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = _Settings(
            stream=stream,
            retries=retries,
            backoff=backoff,
            batch_size=batch_size,
            output=output,
            timeout=timeout,
        )
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT},
            timeout=timeout,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(
        self, method: str, path: str, *, retry_sent: bool = True, **kw: Any
    ) -> httpx.Response:
        s = self.settings
        for attempt in range(s.retries + 1):
            try:
                resp = await self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                if attempt == s.retries or not (retry_sent or isinstance(exc, CONNECT_ERRORS)):
                    raise Unavailable(
                        f"{method} {path}: no answer ({type(exc).__name__})", status=0
                    ) from exc
                await asyncio.sleep(_core.backoff_delay(attempt, s.backoff))
                continue
            if resp.status_code in _core.RETRY_STATUSES and attempt < s.retries:
                retry_after = resp.headers.get("retry-after")
                await asyncio.sleep(_core.backoff_delay(attempt, s.backoff, retry_after))
                continue
            if resp.status_code >= 400:
                raise from_response(resp)
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    async def _split(
        self, send: Callable[[int, int], Awaitable[None]], start: int, end: int
    ) -> None:
        try:
            await send(start, end)
        except PayloadTooLarge:
            if end - start <= 1:
                raise
            mid = (start + end) // 2
            await self._split(send, start, mid)
            await self._split(send, mid, end)

    async def featurize(
        self,
        rows: Any,
        *,
        stream: str | None = None,
        model_id: str | None = None,
        output: str | None = None,
    ) -> Any:
        """See ``Client.featurize``."""
        recs = _core.records(rows)
        if not recs:
            raise ValueError("rows: at least one row is needed")
        path = self.settings.path(stream, "/featurize")
        extra = {"model_id": model_id} if model_id else {}
        payloads: dict[int, dict[str, Any]] = {}
        for _ in range(3):
            payloads.clear()

            async def send(a: int, b: int) -> None:
                resp = await self._request("POST", path, json={"rows": recs[a:b], **extra})
                payloads[a] = resp.json()

            for a, b in _core.batches(len(recs), self.settings.batch_size):
                await self._split(send, a, b)
            if len({p["epoch"] for p in payloads.values()}) == 1:
                break
        ordered = [payloads[k] for k in sorted(payloads)]
        return _core.output(_core.features_table(ordered), output or self.settings.output)

    async def train_set(
        self, *, stream: str | None = None, model_id: str | None = None
    ) -> pa.Table:
        """See ``Client.train_set`` (the chunks are gathered in one Arrow buffer, then read)."""
        s = self.settings
        path = s.path(stream, "/trainset")
        params = {"format": "arrow", **({"model_id": model_id} if model_id else {})}
        for attempt in range(s.retries + 1):
            try:
                async with self._http.stream("GET", path, params=params) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        if resp.status_code in _core.RETRY_STATUSES and attempt < s.retries:
                            await asyncio.sleep(_core.backoff_delay(attempt, s.backoff))
                            continue
                        raise from_response(resp)
                    sink = pa.BufferOutputStream()
                    async for chunk in resp.aiter_bytes():
                        sink.write(chunk)
                    table = pa.ipc.open_stream(sink.getvalue()).read_all()
                    return _core.with_epoch(table, resp.headers.get("x-selectivity-epoch"))
            except (httpx.TransportError, pa.ArrowException) as exc:
                if attempt == s.retries:
                    raise Unavailable(
                        f"GET {path}: incomplete ({type(exc).__name__})", status=0
                    ) from exc
                await asyncio.sleep(_core.backoff_delay(attempt, s.backoff))
        raise AssertionError("unreachable")  # pragma: no cover

    async def register_model(
        self,
        name: str,
        *,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        stream: str | None = None,
    ) -> dict[str, Any]:
        """See ``Client.register_model``."""
        body: dict[str, Any] = {"name": name}
        if webhook_url is not None:
            body["webhook_url"] = webhook_url
        if webhook_secret is not None:
            body["webhook_secret"] = webhook_secret
        path = self.settings.path(stream, "/models")
        return dict((await self._request("POST", path, json=body, retry_sent=False)).json())

    async def stream_info(self, *, stream: str | None = None) -> dict[str, Any]:
        """See ``Client.stream_info``."""
        return dict((await self._request("GET", self.settings.path(stream))).json())

    async def models(self, *, stream: str | None = None) -> list[dict[str, Any]]:
        """The stream's models, oldest first, each with its status (as ``model``)."""
        path = self.settings.path(stream, "/models")
        return list((await self._request("GET", path)).json()["models"])

    async def model(self, model_id: str, *, stream: str | None = None) -> dict[str, Any]:
        path = self.settings.path(stream, f"/models/{model_id}")
        return dict((await self._request("GET", path)).json())

    async def report_trained(
        self, model_id: str, epoch: int, *, stream: str | None = None
    ) -> dict[str, Any]:
        path = self.settings.path(stream, f"/models/{model_id}/trained")
        return dict((await self._request("POST", path, json={"epoch": int(epoch)})).json())

    async def events(
        self,
        *,
        stream: str | None = None,
        last_event_id: int | None = None,
        follow_seconds: float = 300.0,
        reconnect: bool = True,
    ) -> AsyncIterator[Event]:
        """See ``Client.events``."""
        s = self.settings
        path = s.path(stream, "/events")
        last = last_event_id
        attempt = 0
        timeout = httpx.Timeout(s.timeout, read=max(s.timeout, 60.0))
        while True:
            headers = {"Last-Event-ID": str(last)} if last is not None else {}
            try:
                async with self._http.stream(
                    "GET",
                    path,
                    params={"follow_seconds": follow_seconds},
                    headers=headers,
                    timeout=timeout,
                ) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        if resp.status_code in _core.RETRY_STATUSES and attempt < s.retries:
                            await asyncio.sleep(_core.backoff_delay(attempt, s.backoff))
                            attempt += 1
                            continue
                        raise from_response(resp)
                    parser = _core.SSEParser()
                    async for line in resp.aiter_lines():
                        event = parser.feed(line)
                        if event is not None:
                            last, attempt = event.id, 0
                            yield event
            except httpx.TransportError as exc:
                if not reconnect or attempt >= s.retries:
                    raise Unavailable(
                        f"GET {path}: dropped ({type(exc).__name__})", status=0
                    ) from exc
                await asyncio.sleep(_core.backoff_delay(attempt, s.backoff))
                attempt += 1
                continue
            if not reconnect:
                return
            if follow_seconds < 1:
                await asyncio.sleep(1.0)  # the server ended at once: poll, do not spin

    async def ingest(
        self,
        rows: Any,
        *,
        stream: str | None = None,
        idempotency_key: str | None = None,
        label: str = "label",
    ) -> IngestResult:
        """See ``Client.ingest`` (batches are sent one after the other, in order)."""
        obs = _core.observations(rows, label=label)
        if not obs:
            raise ValueError("rows: at least one observation is needed")
        key = _core.check_key(idempotency_key) if idempotency_key else uuid.uuid4().hex
        path = self.settings.path(stream, "/observations")
        result = IngestResult(idempotency_key=key)

        async def send(a: int, b: int) -> None:
            resp = await self._request(
                "POST",
                path,
                json={"observations": obs[a:b]},
                headers={"Idempotency-Key": _core.batch_key(key, a, b)},
            )
            _core.add_ingest(result, resp.json(), resp.headers.get("idempotent-replayed"))

        for a, b in _core.batches(len(obs), self.settings.batch_size):
            await self._split(send, a, b)
        return result
