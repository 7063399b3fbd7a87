"""A submission's Redis work does not depend on the sampling (docs/PRIVACY.md, promise 5
and "Annotation queues", step 2). Redis's own MONITOR, on the test's real Redis, records every
command a submission causes, those its Lua script runs included; the coins are fixed through
the sampler seam (``bernoulli_mask``). Whatever the coins, the commands, their keys and the
sizes of all their arguments are the same, and so is the response: a submitter who times its
requests (or watches Redis's load) cannot tell which of its copies were kept."""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import Any

import numpy as np
import pytest

from service.core.annotation import sampling
from service.queues import service as qservice
from tests.conftest import Api
from tests.queues.test_queues import HOUR_MS, Clock, make_queue


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(qservice, "_now_ms", c)
    return c


class Fixed:
    """``bernoulli_mask`` with its coins given: the sampler seam, not a seeded generator."""

    def __init__(self, mask: list[bool]) -> None:
        self.mask = mask

    def __call__(self, n: int, beta: float, **kw: Any) -> np.ndarray:
        assert n == len(self.mask)
        return np.asarray(self.mask, dtype=bool)


_LINE = re.compile(rb"^\+?[0-9.]+ \[\d+ ([^\]]*)\] (.*)$", re.S)
_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESC = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b", b'"': b'"', b"\\": b"\\"}


def _unescape(s: bytes) -> bytes:
    """MONITOR prints each argument as Redis's sdscatrepr: quoted, with \\xHH and C escapes."""
    out, i = bytearray(), 0
    while i < len(s):
        if s[i : i + 1] == b"\\":
            nxt = s[i + 1 : i + 2]
            if nxt == b"x":
                out.append(int(s[i + 2 : i + 4], 16))
                i += 4
                continue
            out += _ESC[nxt]
            i += 2
            continue
        out.append(s[i])
        i += 1
    return bytes(out)


class CommandLog:
    """Every command Redis runs while open (MONITOR on a connection of its own): per command,
    who ran it ('lua' for a script's) and its arguments, unescaped."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.lines: list[tuple[bytes, list[bytes]]] = []
        self.end = b"end-" + secrets.token_hex(8).encode()

    async def __aenter__(self) -> CommandLog:
        self.monitor = self.api.ctx.redis.monitor()
        await self.monitor.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.api.ctx.redis.echo(self.end)  # every command before it is in the log
        conn = self.monitor.connection
        assert conn is not None
        while True:
            raw = await asyncio.wait_for(conn.read_response(), timeout=30)
            m = _LINE.match(raw if isinstance(raw, bytes) else raw.encode())
            assert m is not None, raw
            args = [_unescape(a) for a in _ARG.findall(m.group(2))]
            if self.end in args:
                break
            self.lines.append((m.group(1), args))
        await self.monitor.__aexit__(*exc)

    def of_queue(self, q: str) -> list[tuple[bytes, list[bytes]]]:
        tag = b"{q:" + q.encode() + b"}"
        return [(who, a) for who, a in self.lines if any(tag in x for x in a)]


def shape(lines: list[tuple[bytes, list[bytes]]], q: str) -> list[tuple[Any, ...]]:
    """What timing could depend on: who ran each command, its name, its keys (the queue's
    name left out) and the size of every other argument."""
    tag = b"{q:" + q.encode() + b"}"
    out = []
    for who, args in lines:
        who = b"lua" if who == b"lua" else b"client"
        name, rest = args[0].lower(), args[1:]
        if name == b"evalsha":
            rest = rest[1:]  # the script's SHA: the same script
        out.append((who, name, *(x.replace(tag, b"{q:Q}") if tag in x else len(x) for x in rest)))
    return out


TEXTS = ["Alpha query", "alpha  query", "ALPHA query", "bravo", "charlie", "charlie", "delta"]
UNCERTAINTIES = [0.05, 0.01, 0.65, 0.3, 0.91, 0.95, 0.5]
BATCH = [{"text": t, "uncertainty": u} for t, u in zip(TEXTS, UNCERTAINTIES, strict=True)]


async def test_a_submission_runs_the_same_redis_commands_whatever_the_coins(
    qapi: Api, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    # k = 2: with every candidate kept, "alpha query" (bucket 0.0–0.1 twice) and "charlie"
    # (bucket 0.9–1.0 twice) reach k in this batch and write their release blobs; with none
    # kept nothing does. The old script took only the kept candidates: its work grew with
    # each kept one.
    coins = {
        "none": [False] * len(TEXTS),
        "all": [True] * len(TEXTS),
        "some": [i % 2 == 0 for i in range(len(TEXTS))],
    }
    seen: dict[str, tuple[Any, ...]] = {}
    warm = await make_queue(qapi, beta=0.5, k=2)  # the first call loads the script (NOSCRIPT)
    r = await qapi.post(f"/v1/queues/{warm}/candidates", "curator", json={"candidates": BATCH})
    assert r.status_code == 200
    for name, mask in coins.items():
        q = await make_queue(qapi, beta=0.5, k=2)
        monkeypatch.setattr(qservice, "bernoulli_mask", Fixed(mask))
        async with CommandLog(qapi) as log:
            r = await qapi.post(f"/v1/queues/{q}/candidates", "curator", json={"candidates": BATCH})
        lines = log.of_queue(q)
        assert any(who == b"lua" for who, _ in lines)  # the script's own commands are seen
        seen[name] = (r.status_code, r.content, shape(lines, q))
        if name == "none":  # what was not kept reached Redis as placeholders only
            rt = await qservice.runtime(ctx=qapi.ctx, name=q)
            digests = {
                qservice.digest_of(rt.secret, "text", sampling.canonical_text(t).encode())[
                    :16
                ].hex()
                for t in TEXTS
            }
            for _, args in lines:
                for a in args:
                    assert not any(d.encode() in a for d in digests)
                    assert b"query" not in a and b"bravo" not in a
        if name == "all":  # and the counting did happen: two classes are ready
            blobs = await qapi.ctx.stores.queues.ready(queue=q, period=clock.ms // HOUR_MS)
            assert len(blobs) == 2
    assert seen["none"] == seen["all"] == seen["some"]
    assert seen["none"][:2] == (200, b'{"received":7}')
