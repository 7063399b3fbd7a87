"""CLI for the cold store and break-glass access: ``admin init-coldstore``, ``audit verify``,
and ``unlock request|approve|status|list|export|close`` (the last over HTTP, as an analyst or admin
would use them)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from service.audit import service as audit
from service.cli import db as cli_db
from service.cli.http import checked, http_client
from service.config import Settings
from service.db.session import make_sessionmaker

T = TypeVar("T")


def _with_db(fn: Callable[[Any], Awaitable[T]]) -> T:
    try:
        s = Settings()
    except Exception as exc:
        sys.exit(f"configuration error: {exc}")

    async def main() -> T:
        engine = cli_db.engine(s.resolved_database_url)
        try:
            return await fn(make_sessionmaker(engine, s))
        finally:
            await engine.dispose()

    return asyncio.run(main())


def cmd_init_coldstore(args: argparse.Namespace) -> None:
    """Create (or rotate) the cold-store key and print its shares, once."""
    # here, not at the top: the cold store's module brings the numerical stack (scipy through
    # the lifecycle), which every other command, and `selectivity --help`, would pay for
    from service.coldstore.service import KeyExists, init_key

    try:
        if not 1 <= args.threshold <= args.shares <= 16 or (args.threshold == 1 < args.shares):
            raise ValueError("need 2 <= threshold <= shares <= 16 (or 1 of 1)")
    except ValueError as exc:
        sys.exit(f"error: {exc}")

    async def run(sessionmaker: Any) -> tuple[int, list[str]]:
        row, shares = await init_key(
            sessionmaker=sessionmaker,
            shares=args.shares,
            threshold=args.threshold,
            actor="cli",
            rotate=args.rotate,
        )
        return row.id, shares

    try:
        key_id, shares = _with_db(run)
    except KeyExists as exc:
        sys.exit(f"error: {exc} (pass --rotate to seal new segments to a new key)")
    print(
        f"cold-store key {key_id}: {args.shares} shares, any {args.threshold} open it.\n"
        "Give each share to a different admin, to keep OFFLINE. They are shown only now;\n"
        "the service keeps only the public key and a verification tag.\n"
    )
    for i, share in enumerate(shares, 1):
        print(f"share {i}: {share}\n")


_HEAD = re.compile(r"([1-9][0-9]{0,17}):([0-9a-fA-F]{64})")


def parse_head(value: str) -> tuple[int, bytes]:
    """``SEQ:HASH`` as ``audit verify`` prints a head: an entry number and its 64-hex-digit
    hash (``ValueError`` otherwise)."""
    m = _HEAD.fullmatch(value.strip())
    if m is None:
        raise ValueError(
            "--expect-head must be SEQ:HASH, an entry number and its 64-hex-digit hash as "
            f"`selectivity audit verify` prints them (got {value[:80]!r})"
        )
    return int(m[1]), bytes.fromhex(m[2])


def cmd_audit_verify(args: argparse.Namespace) -> None:
    """Walk the chain, check it against the anchor (and a head noted elsewhere); exit 1 when
    anything is wrong, 2 on a malformed --expect-head."""
    expect = None
    if args.expect_head is not None:
        try:
            expect = parse_head(args.expect_head)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)

    async def run(sessionmaker: Any) -> audit.Verdict:
        async with sessionmaker() as session:
            return await audit.verify(session, expect_head=expect)

    try:
        v = _with_db(run)
    except audit.AuditSetupError as exc:
        sys.exit(f"error: {exc}")
    except SQLAlchemyError as exc:
        if cli_db.describe(exc, None) is not None:
            raise  # the database cannot be used at all: service.cli.db says why
        sys.exit(f"error: cannot read the audit log ({type(exc).__name__}): is it migrated?")
    if not v.ok:
        where = f"TAMPERED: entry {v.first_bad_seq}" if v.first_bad_seq else "FAILED"
        print(f"{where}: {v.problem}")
        print(f"the chain is intact up to entry {v.head_seq} (hash {v.head_hash})")
        sys.exit(1)
    print(f"ok: {v.entries} entries, chain intact; head seq {v.head_seq} hash {v.head_hash}")
    if v.keyed_from is not None:
        plain = f"; entries 1-{v.keyed_from - 1} plain SHA-256" if v.keyed_from > 1 else ""
        print(f"keyed (HMAC-SHA256, key id {v.key_id}) from entry {v.keyed_from}{plain}")
    if v.anchor is not None:
        a = v.anchor
        print(f"anchor {v.anchor_path}: seq {a.seq} hash {a.hash.hex()}, keyed from {a.keyed_from}")
    if expect is not None:
        print(f"entry {expect[0]} has the expected hash")
    for note in v.notes:
        print(f"note: {note}")


# -- unlock over HTTP ---------------------------------------------------------------------


def _show(body: dict[str, Any]) -> None:
    print(json.dumps(body, indent=2))


def cmd_unlock_request(args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"stream": args.stream, "justification": args.justification}
    if args.from_window is not None or args.to_window is not None:
        body |= {"from_window": args.from_window, "to_window": args.to_window}
    if args.from_time is not None or args.to_time is not None:
        body |= {"from_time": args.from_time, "to_time": args.to_time}
    if args.ttl is not None:
        body["ttl_seconds"] = args.ttl
    with http_client(args) as c:
        _show(checked(c.post("/v1/admin/unlock-requests", json=body)))


def cmd_unlock_approve(args: argparse.Namespace) -> None:
    """The share is read from stdin (or a hidden prompt): never from the command line, where
    it would land in the shell history and the process list."""
    share = (
        sys.stdin.readline().strip()
        if not sys.stdin.isatty()
        else getpass.getpass("your SLIP-39 share (hidden): ").strip()
    )
    with http_client(args) as c:
        url = f"/v1/admin/unlock-requests/{args.id}/approve"
        _show(checked(c.post(url, json={"share": share})))


def cmd_unlock_status(args: argparse.Namespace) -> None:
    with http_client(args) as c:
        _show(checked(c.get(f"/v1/admin/unlock-requests/{args.id}")))


def cmd_unlock_close(args: argparse.Namespace) -> None:
    with http_client(args) as c:
        _show(checked(c.post(f"/v1/admin/unlock-requests/{args.id}/close")))


def cmd_unlock_export(args: argparse.Namespace) -> None:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    params = {
        k: v
        for k, v in {
            "format": args.format,
            "from_window": args.from_window,
            "to_window": args.to_window,
            "from_time": args.from_time,
            "to_time": args.to_time,
        }.items()
        if v is not None
    }
    out = args.out or f"unlock-{args.id}.{'ndjson' if args.format == 'ndjson' else 'arrow'}"
    with (
        http_client(args) as c,
        c.stream("GET", f"/v1/admin/unlock-requests/{args.id}/export", params=params) as resp,
    ):
        if resp.status_code >= 400:
            resp.read()
            checked(resp)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with (
            os.fdopen(fd, "wb") as f,
            Progress(TextColumn("exporting"), BarColumn(), DownloadColumn()) as bar,
        ):
            task = bar.add_task("export", total=None)
            for chunk in resp.iter_bytes():
                f.write(chunk)
                bar.update(task, advance=len(chunk))
    manifest = _manifest(out, args.format)
    print(f"written to {out} (mode 0600)")
    if manifest is None:
        print("warning: the export has no manifest: it was cut short")
        sys.exit(1)
    for w in manifest.get("rows_per_window", []):
        print(f"window {w['window']}: {w['rows']} rows")
    for w in manifest.get("not_sealed", []):
        print(f"window {w['window']} ({w['state']}): {w['note']}")
    for w in manifest.get("deleted_by_retention", []):
        print(f"window {w}: its raw rows were deleted by the stream's cold retention")
    if not manifest.get("rows_per_window") and not manifest.get("not_sealed"):
        print("no window of the range holds sealed data")
    if manifest.get("failed_segments"):
        print(f"{manifest['failed_segments']} segment(s) failed their checks")
    if not manifest.get("complete", True):
        print("warning: the grant ended during the export: it is incomplete")


def _manifest(path: str, fmt: str) -> dict[str, Any] | None:
    """The export's manifest, its last record."""
    if fmt == "ndjson":
        last = b""
        with open(path, "rb") as f:
            for line in f:
                last = line
        if not last.startswith(b'{"manifest"'):
            return None
        return dict(json.loads(last)["manifest"])
    import pyarrow as pa

    found = None
    try:
        with open(path, "rb") as f, pa.ipc.open_stream(f) as reader:
            while True:
                try:
                    _, meta = reader.read_next_batch_with_custom_metadata()
                except StopIteration:
                    break
                if meta is not None and b"manifest" in meta:
                    found = json.loads(meta[b"manifest"])["manifest"]
    except pa.ArrowInvalid:
        return None
    return found


def cmd_unlock_list(args: argparse.Namespace) -> None:
    """Unlock requests, newest first (admins): one line each, every page."""
    params: dict[str, Any] = {"limit": 100}
    if args.status:
        params["status"] = args.status
    n = 0
    with http_client(args) as c:
        while True:
            page = checked(c.get("/v1/admin/unlock-requests", params=params))
            for r in page["requests"]:
                rng = (
                    f"windows {r['from_window']}..{r['to_window']}"
                    if r["from_window"] is not None
                    else f"{r['from_time']}..{r['to_time']}"
                )
                print(
                    f"{r['id']}  {r['status']:<8} {r['stream']}  {rng}  by {r['requested_by']}"
                    f" ({r['requester_actor']})"
                    f"  {r['created_at']}  approvals {r['approvals']}/{r['threshold']}"
                )
                n += 1
            if not page.get("next_before") or (args.limit and n >= args.limit):
                break
            params["before"] = page["next_before"]
    if n == 0:
        print("no unlock requests" + (f" with status {args.status}" if args.status else ""))


def register(sub: Any, admin: Any) -> Any:
    """The cold-store commands; returns ``selectivity audit``'s sub-commands (for
    ``service.cli.audit``)."""
    ic = admin.add_parser("init-coldstore", help="create the cold-store key; print its shares")
    ic.add_argument("--shares", type=int, default=3)
    ic.add_argument("--threshold", type=int, default=2)
    ic.add_argument("--rotate", action="store_true", help="retire the current key for a new one")
    ic.set_defaults(fn=cmd_init_coldstore)

    au = sub.add_parser("audit", help="the audit log").add_subparsers(dest="audit", required=True)
    av = au.add_parser(
        "verify", help="check the keyed hash chain and its anchor; report the first bad entry"
    )
    av.add_argument(
        "--expect-head",
        metavar="SEQ:HASH",
        help="a head printed earlier and kept elsewhere: entry SEQ must still have HASH",
    )
    av.set_defaults(fn=cmd_audit_verify)

    ul = sub.add_parser("unlock", help="break-glass access to the cold store (over HTTP)")
    us = ul.add_subparsers(dest="unlock", required=True)

    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--url", default=os.environ.get("SELECTIVITY_URL", "http://127.0.0.1:8000"))
        p.add_argument("--key", help="API key (default: $SELECTIVITY_API_KEY)")
        return p

    def ranges(p: argparse.ArgumentParser) -> None:
        p.add_argument("--from-window", type=int)
        p.add_argument("--to-window", type=int)
        p.add_argument("--from-time", help="ISO 8601 with a zone, e.g. 2026-11-01T00:00:00Z")
        p.add_argument("--to-time")

    r = common(us.add_parser("request", help="file a request (analyst)"))
    r.add_argument("--stream", required=True)
    r.add_argument("--justification", required=True)
    r.add_argument("--ttl", type=int, help="grant lifetime in seconds (default 900)")
    ranges(r)
    r.set_defaults(fn=cmd_unlock_request)
    for name, fn, help_ in (
        (
            "approve",
            cmd_unlock_approve,
            "approve with your share, read from stdin (admin; not the requester's actor)",
        ),
        ("status", cmd_unlock_status, "show a request"),
        ("close", cmd_unlock_close, "end a grant now"),
    ):
        p = common(us.add_parser(name, help=help_))
        p.add_argument("id")
        p.set_defaults(fn=fn)
    ls = common(us.add_parser("list", help="list requests, newest first (admin)"))
    ls.add_argument("--status", choices=["pending", "granted", "closed"])
    ls.add_argument("--limit", type=int, default=0, help="show at most this many (default all)")
    ls.set_defaults(fn=cmd_unlock_list)
    e = common(us.add_parser("export", help="download the granted range (analyst)"))
    e.add_argument("id")
    e.add_argument("--format", choices=["ndjson", "arrow"], default="ndjson")
    e.add_argument("--out")
    ranges(e)
    e.set_defaults(fn=cmd_unlock_export)
    return au
