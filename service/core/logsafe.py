"""Logs that carry no row value (docs/PRIVACY.md, promise 1).

An allow-list, applied to every log record of the process when it is made (``install`` wraps
the record factory) and again by a ``logging.Filter`` on the handlers of the root logger,
uvicorn, SAQ and the worker:

- An exception is rendered as its type and its frames (file, line, function and the source
  line, which is code), never as ``str(exc)``: a database driver's message holds the SQL
  parameters, a validation error the value it refused, a job's exception whatever its code
  put there. Only messages known to hold no data are kept: the exact SQLite messages of
  ``SAFE_MESSAGES``, an ``OSError``'s ``strerror`` (the operating system's text, without the
  file name), and exceptions of ``SafeMessageError`` (messages built from such renderings).
  Local variables are never rendered. Chained and grouped exceptions are rendered alike.
- An exception passed as a message argument is rendered as above.
- Records of loggers outside ``selectivity`` (uvicorn, SAQ, asyncio, libraries) keep their
  message template, arguments that are numbers, booleans, None or strings, and the first line
  of a message without arguments (asyncio puts a task's repr, its exception's message with
  it, on the lines after); any other argument is its type's name. The service's own records
  keep their arguments: its call sites pass names, ids, counts and exception types, never
  rows, justifications or header values.

What is kept of a string argument is not checked: a caller that passes a row value as a
string would log it. The tests push a canary through every error path they can force
(``tests/test_log_filter.py``, ``tests/test_canary.py``)."""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

TRUSTED = "selectivity"
"""Loggers whose call sites are the service's own (``selectivity`` and ``selectivity.*``)."""

SAFE_MESSAGES = frozenset(
    {
        "database is locked",
        "database table is locked",
        "database or disk is full",
        "disk I/O error",
        "unable to open database file",
        "attempt to write a readonly database",
    }
)
"""Exception messages kept verbatim: SQLite's own texts, which name no value."""

_MARK = "_logsafe"
_PLAIN = (str, int, float, bool, type(None))


class SafeMessageError(Exception):
    """An exception whose message is built only from this module's renderings (or from
    constants): the one kind whose message a log shows."""


def type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _message(exc: BaseException) -> str | None:
    """The part of ``str(exc)`` that may be shown, or None."""
    if isinstance(exc, SafeMessageError):
        return str(exc)
    if isinstance(exc, OSError) and isinstance(exc.strerror, str):
        return f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None else exc.strerror
    try:
        text = str(exc)
    except Exception:
        return None
    return text if text in SAFE_MESSAGES else None


def describe(exc: BaseException) -> str:
    """``module.Type`` with the message only if it is known to hold no data; an exception that
    wraps another one (SQLAlchemy's ``DBAPIError.orig``) names it the same way."""
    out = type_name(exc)
    msg = _message(exc)
    if msg:
        out += f": {msg}"
    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException) and orig is not exc:
        out += f" (from {describe(orig)})"
    return out


def _frames(tb: TracebackType | None) -> list[str]:
    if tb is None:
        return []
    return [
        "Traceback (most recent call last):\n",
        *traceback.format_list(traceback.extract_tb(tb)),
    ]


def _chain(exc: BaseException, seen: set[int]) -> Iterator[str]:
    seen.add(id(exc))
    cause, context = exc.__cause__, exc.__context__
    if cause is not None and id(cause) not in seen:
        yield from _chain(cause, seen)
        yield "\nThe above exception was the direct cause of the following exception:\n\n"
    elif context is not None and not exc.__suppress_context__ and id(context) not in seen:
        yield from _chain(context, seen)
        yield "\nDuring handling of the above exception, another exception occurred:\n\n"
    yield from _frames(exc.__traceback__)
    yield describe(exc) + "\n"
    if isinstance(exc, BaseExceptionGroup):
        for i, sub in enumerate(exc.exceptions, 1):
            yield f"+---------------- {i} ----------------\n"
            for line in _chain(sub, seen):
                yield "".join(f"| {part}\n" for part in line.rstrip("\n").split("\n"))


def format_exception(exc: BaseException) -> str:
    """``traceback.format_exception(exc)`` with every exception of the chain rendered by
    ``describe``: types and frames, no message of untrusted types, no local variables."""
    return "".join(_chain(exc, set())).rstrip("\n")


def _safe_arg(value: Any, trusted: bool) -> Any:
    if isinstance(value, BaseException):
        return describe(value)
    if trusted or isinstance(value, _PLAIN):
        return value
    if hasattr(value, "function") and hasattr(value, "key"):  # a SAQ job: what and which
        return f"Job<function: {value.function}, key: {value.key}>"
    return f"<{type(value).__name__}>"


def sanitize(record: logging.LogRecord) -> logging.LogRecord:
    """Make ``record`` safe in place (once): see the module's docstring."""
    if getattr(record, _MARK, False):
        return record
    trusted = record.name == TRUSTED or record.name.startswith(TRUSTED + ".")
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None:
        record.exc_text = format_exception(exc)
    elif record.exc_text:  # rendered by someone else (another process, an earlier formatter)
        record.exc_text = "(exception text withheld)"
    record.exc_info = None
    if isinstance(record.msg, BaseException):
        record.msg = describe(record.msg)
    elif not isinstance(record.msg, str):
        record.msg = record.msg if trusted else f"<{type(record.msg).__name__}>"
    elif not trusted and not record.args and "\n" in record.msg.strip("\n"):
        record.msg = record.msg.strip("\n").split("\n", 1)[0] + " (further lines withheld)"
    args = record.args
    if isinstance(args, tuple):
        record.args = tuple(_safe_arg(a, trusted) for a in args)
    elif args:  # a mapping, for %(name)s
        record.args = {k: _safe_arg(v, trusted) for k, v in args.items()}
    setattr(record, _MARK, True)
    return record


class SafeLogFilter(logging.Filter):
    """``sanitize`` as a ``logging.Filter``: on a handler, every record it emits is safe,
    whichever logger made it."""

    def filter(self, record: logging.LogRecord) -> bool:
        sanitize(record)
        return True


_installed: list[Callable[..., logging.LogRecord]] = []


def _excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    sys.stderr.write(format_exception(exc.with_traceback(tb)) + "\n")


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        name = args.thread.name if args.thread is not None else "?"
        sys.stderr.write(f"Exception in thread {name}:\n{format_exception(args.exc_value)}\n")


def install(*loggers: str) -> None:
    """Every record made from now on is sanitized (the record factory), and a
    ``SafeLogFilter`` sits on the root logger, on ``loggers`` and on their handlers present
    now; uncaught exceptions (main thread, other threads) are printed the same way.
    Idempotent: call it after handlers are configured."""
    if not _installed:
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            return sanitize(previous(*args, **kwargs))

        logging.setLogRecordFactory(factory)
        _installed.append(factory)
        sys.excepthook = _excepthook
        threading.excepthook = _thread_excepthook
    for name in ("", *loggers):
        logger = logging.getLogger(name)
        for target in (logger, *logger.handlers):
            if not any(isinstance(f, SafeLogFilter) for f in target.filters):
                target.addFilter(SafeLogFilter())
