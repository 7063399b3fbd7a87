"""The ingest load of the load generators (``bench speed``, ``bench scale``): a range of the
click log as request bodies, built before the clock starts, and their POSTs, on a plain
``http.client`` connection (the generator's own CPU per request stays small and is measured)."""

from __future__ import annotations

import http.client

import orjson

from service.cli.synthetic import ClickLog


def ingest_bodies(log: ClickLog, lo: int, hi: int, batch: int) -> list[bytes]:
    """Rows ``lo:hi`` of ``log`` as ``POST …/observations`` bodies of ``batch`` rows each."""
    return [
        orjson.dumps({"observations": log.observations(s, min(s + batch, hi))})
        for s in range(lo, hi, batch)
    ]


class Ingest:
    """``POST /v1/streams/{stream}/observations`` with ``key`` as the bearer."""

    def __init__(self, stream: str, key: str) -> None:
        self.path = f"/v1/streams/{stream}/observations"
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}

    def post(self, conn: http.client.HTTPConnection, body: bytes) -> int:
        """Send one body; the rows the service accepted (``RuntimeError`` unless 202)."""
        conn.request("POST", self.path, body=body, headers=self.headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 202:
            raise RuntimeError(f"ingest: {resp.status} {data[:300]!r}")
        return int(orjson.loads(data)["accepted"])
