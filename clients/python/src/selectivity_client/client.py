"""The synchronous client (``Client``); ``AsyncClient`` in ``aio.py`` has the same methods."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pyarrow as pa

from selectivity_client import _core
from selectivity_client._core import Event, IngestResult
from selectivity_client.errors import PayloadTooLarge, Unavailable, from_response

USER_AGENT = "selectivity-client/0.1"
CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)


class _Settings:
    """What both clients are configured with."""

    def __init__(
        self,
        *,
        stream: str | None,
        retries: int,
        backoff: float,
        batch_size: int,
        output: str | None,
        timeout: float,
    ) -> None:
        if retries < 0 or backoff < 0 or batch_size < 1:
            raise ValueError("retries and backoff must be >= 0, batch_size >= 1")
        self.stream, self.retries, self.backoff = stream, retries, backoff
        self.batch_size, self.output, self.timeout = batch_size, output, timeout

    def path(self, stream: str | None, tail: str = "") -> str:
        name = stream or self.stream
        if not name:
            raise ValueError("stream: pass stream= here or to the client")
        return f"/v1/streams/{name}{tail}"


class _IterReader(io.RawIOBase):
    """A file over an iterator of byte chunks, so pyarrow reads the train set as it arrives
    (in a ``BufferedReader``: pyarrow takes a short read for the end of the file)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._buf = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buf = chunk
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


class Client:
    """A model manager's (or producer's) client of one Selectivity service.

    ``Client(url, api_key, stream="clicks")``; every method also takes ``stream=``. Requests
    that fail with 503 or without an answer are retried ``retries`` times with exponential
    backoff (ingest safely: every batch has its own Idempotency-Key). Errors are typed
    (``selectivity_client.errors``).
    """

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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = _Settings(
            stream=stream,
            retries=retries,
            backoff=backoff,
            batch_size=batch_size,
            output=output,
            timeout=timeout,
        )
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT},
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------

    def _request(
        self, method: str, path: str, *, retry_sent: bool = True, **kw: Any
    ) -> httpx.Response:
        """One call, retried on 503 and on transport errors (only on those raised before the
        request was sent when ``retry_sent`` is false: the call is not idempotent)."""
        s = self.settings
        for attempt in range(s.retries + 1):
            try:
                resp = self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                if attempt == s.retries or not (retry_sent or isinstance(exc, CONNECT_ERRORS)):
                    raise Unavailable(
                        f"{method} {path}: no answer ({type(exc).__name__})", status=0
                    ) from exc
                time.sleep(_core.backoff_delay(attempt, s.backoff))
                continue
            if resp.status_code in _core.RETRY_STATUSES and attempt < s.retries:
                time.sleep(_core.backoff_delay(attempt, s.backoff, resp.headers.get("retry-after")))
                continue
            if resp.status_code >= 400:
                raise from_response(resp)
            return resp
        raise AssertionError("unreachable")  # pragma: no cover

    def _split(self, send: Callable[[int, int], None], start: int, end: int) -> None:
        """``send(start, end)``, halving the range on 413 (the service's batch or body limit
        is lower than ``batch_size``)."""
        try:
            send(start, end)
        except PayloadTooLarge:
            if end - start <= 1:
                raise
            mid = (start + end) // 2
            self._split(send, start, mid)
            self._split(send, mid, end)

    # -- model manager -------------------------------------------------------------------------

    def featurize(
        self,
        rows: Any,
        *,
        stream: str | None = None,
        model_id: str | None = None,
        output: str | None = None,
    ) -> Any:
        """Count features of ``rows`` (dicts, a DataFrame or a pyarrow Table of raw feature
        values), in row order, one float column per feature column of the service (NaN/null
        where a value is missing), a string column for each categorical feature passed
        through (its raw value). A DataFrame when pandas is installed (``attrs
        ["selectivity_epoch"]``), else a pyarrow Table (epoch in its schema metadata); choose
        with ``output="pandas" | "arrow" | "records"``. With ``model_id``, raises
        ``RetrainRequired`` once that model is past its retrain grace period. Batches of
        ``batch_size`` rows; should the epoch move between batches, the whole call is redone
        so that every row is featurized at the same epoch."""
        recs = _core.records(rows)
        if not recs:
            raise ValueError("rows: at least one row is needed")
        path = self.settings.path(stream, "/featurize")
        extra = {"model_id": model_id} if model_id else {}
        payloads: dict[int, dict[str, Any]] = {}
        for _ in range(3):
            payloads.clear()

            def send(a: int, b: int) -> None:
                payloads[a] = self._request("POST", path, json={"rows": recs[a:b], **extra}).json()

            for a, b in _core.batches(len(recs), self.settings.batch_size):
                self._split(send, a, b)
            if len({p["epoch"] for p in payloads.values()}) == 1:
                break
        ordered = [payloads[k] for k in sorted(payloads)]
        return _core.output(_core.features_table(ordered), output or self.settings.output)

    def train_set(self, *, stream: str | None = None, model_id: str | None = None) -> pa.Table:
        """The hot period, featurized (Arrow IPC, read as it streams in): ``id``,
        ``event_time``, ``window``, ``label`` and the feature columns (float; string for
        categorical features passed through). Its epoch (the
        ``X-Selectivity-Epoch`` header) is in the schema metadata: ``epoch_of(table)``. With
        ``model_id``, the service records that model as trained at this epoch."""
        s = self.settings
        path = s.path(stream, "/trainset")
        params = {"format": "arrow", **({"model_id": model_id} if model_id else {})}
        for attempt in range(s.retries + 1):
            try:
                with self._http.stream("GET", path, params=params) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        if resp.status_code in _core.RETRY_STATUSES and attempt < s.retries:
                            time.sleep(_core.backoff_delay(attempt, s.backoff))
                            continue
                        raise from_response(resp)
                    body = io.BufferedReader(_IterReader(resp.iter_bytes()), 1 << 16)
                    reader = pa.ipc.open_stream(body)
                    table = reader.read_all()
                    return _core.with_epoch(table, resp.headers.get("x-selectivity-epoch"))
            except (httpx.TransportError, pa.ArrowException) as exc:
                if attempt == s.retries:
                    raise Unavailable(
                        f"GET {path}: incomplete ({type(exc).__name__})", status=0
                    ) from exc
                time.sleep(_core.backoff_delay(attempt, s.backoff))
        raise AssertionError("unreachable")  # pragma: no cover

    def register_model(
        self,
        name: str,
        *,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        stream: str | None = None,
    ) -> dict[str, Any]:
        """Register a model of the stream; its ``id`` is what featurize, train_set and
        report_trained take (``webhook_secret`` is shown once)."""
        body: dict[str, Any] = {"name": name}
        if webhook_url is not None:
            body["webhook_url"] = webhook_url
        if webhook_secret is not None:
            body["webhook_secret"] = webhook_secret
        path = self.settings.path(stream, "/models")
        return dict(self._request("POST", path, json=body, retry_sent=False).json())

    def stream_info(self, *, stream: str | None = None) -> dict[str, Any]:
        """The stream's configuration and state (features, labels, epoch, ...)."""
        return dict(self._request("GET", self.settings.path(stream)).json())

    def models(self, *, stream: str | None = None) -> list[dict[str, Any]]:
        """The stream's models, oldest first, each with its status (as ``model``)."""
        return list(self._request("GET", self.settings.path(stream, "/models")).json()["models"])

    def model(self, model_id: str, *, stream: str | None = None) -> dict[str, Any]:
        """A model's status: ``current``, ``stale``, ``untrained`` or ``refused``."""
        return dict(self._request("GET", self.settings.path(stream, f"/models/{model_id}")).json())

    def report_trained(
        self, model_id: str, epoch: int, *, stream: str | None = None
    ) -> dict[str, Any]:
        """Report that the model was trained on the train set of ``epoch``."""
        path = self.settings.path(stream, f"/models/{model_id}/trained")
        return dict(self._request("POST", path, json={"epoch": int(epoch)}).json())

    def events(
        self,
        *,
        stream: str | None = None,
        last_event_id: int | None = None,
        follow_seconds: float = 300.0,
        reconnect: bool = True,
    ) -> Iterator[Event]:
        """The stream's server-sent events (``roll``, ``retrain_required``) after
        ``last_event_id``. A dropped connection is resumed from the last event seen
        (``Last-Event-ID``), so no event is lost or repeated. With ``reconnect`` (the default)
        it never ends: when the server closes the stream after ``follow_seconds`` it is opened
        again; without, it ends then (``follow_seconds=0``: the backlog only)."""
        s = self.settings
        path = s.path(stream, "/events")
        last = last_event_id
        attempt = 0
        timeout = httpx.Timeout(s.timeout, read=max(s.timeout, 60.0))
        while True:
            headers = {"Last-Event-ID": str(last)} if last is not None else {}
            try:
                with self._http.stream(
                    "GET",
                    path,
                    params={"follow_seconds": follow_seconds},
                    headers=headers,
                    timeout=timeout,
                ) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        if resp.status_code in _core.RETRY_STATUSES and attempt < s.retries:
                            time.sleep(_core.backoff_delay(attempt, s.backoff))
                            attempt += 1
                            continue
                        raise from_response(resp)
                    parser = _core.SSEParser()
                    for line in resp.iter_lines():
                        event = parser.feed(line)
                        if event is not None:
                            last, attempt = event.id, 0
                            yield event
            except httpx.TransportError as exc:
                if not reconnect or attempt >= s.retries:
                    raise Unavailable(
                        f"GET {path}: dropped ({type(exc).__name__})", status=0
                    ) from exc
                time.sleep(_core.backoff_delay(attempt, s.backoff))
                attempt += 1
                continue
            if not reconnect:
                return
            if follow_seconds < 1:
                time.sleep(1.0)  # the server ended at once: poll, do not spin

    # -- producer ------------------------------------------------------------------------------

    def ingest(
        self,
        rows: Any,
        *,
        stream: str | None = None,
        idempotency_key: str | None = None,
        label: str = "label",
    ) -> IngestResult:
        """Send observations: dicts with ``features`` and ``label`` (and optional ``id``,
        ``event_time``), or flat rows / a DataFrame whose ``label`` column is the label, whose
        ``id`` and ``event_time`` columns are taken as such and whose other columns are the
        features. Sent in batches of ``batch_size`` (halved on 413), each with the
        Idempotency-Key ``<key>:<first>-<end>`` so a retried batch is counted once; without
        ``idempotency_key`` a random one is made for this call (pass your own to make repeating
        the whole call safe, with the same rows and batch_size)."""
        obs = _core.observations(rows, label=label)
        if not obs:
            raise ValueError("rows: at least one observation is needed")
        key = _core.check_key(idempotency_key) if idempotency_key else uuid.uuid4().hex
        path = self.settings.path(stream, "/observations")
        result = IngestResult(idempotency_key=key)

        def send(a: int, b: int) -> None:
            resp = self._request(
                "POST",
                path,
                json={"observations": obs[a:b]},
                headers={"Idempotency-Key": _core.batch_key(key, a, b)},
            )
            _core.add_ingest(result, resp.json(), resp.headers.get("idempotent-replayed"))

        for a, b in _core.batches(len(obs), self.settings.batch_size):
            self._split(send, a, b)
        return result
