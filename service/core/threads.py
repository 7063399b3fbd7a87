"""The thread limit of the service's heavy computations (``Settings.audit_threads``, default 1):
a re-identification audit (``service.audits``) and a k-anonymised release or an iML question
(``service.anonymize``), so that one heavy job does not take every core from the API and the
counting job on a shared machine.

The audits' training steps are small matrix products: with BLAS's default of one thread per
core they run no faster on a shared 2-core machine (a linear step was 20× slower), and their
threads contend with the API and the counting job for the same cores. SaNGreeA's numpy work is
mostly element-wise, but whatever BLAS or OpenMP it reaches is held to the same limit.

``threadpoolctl`` sets the limits, which differ in scope, hence two context managers:

- ``blas_limited``, entered on the event loop's thread (the job's, or the request's): the BLAS
  libraries' limit (OpenBLAS on pthreads, as numpy's and scipy's wheels ship it; MKL; BLIS) is
  the process's. threadpoolctl lets one thread at a time set it (the first to do so; the others
  are ignored silently), so it is set from the thread every job runs on, not from the
  computations' threads. While any limited computation runs, every BLAS call of the process
  (an embedded-mode API included) is limited; the limit found before is restored when the last
  running one ends (they may overlap, and end in any order).
- ``openmp_limited``, entered in the computation's own thread: an OpenMP runtime's limit (and an
  OpenMP-built OpenBLAS's) is the calling thread's, so each computation sets and restores its
  own."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from threadpoolctl import ThreadpoolController

log = logging.getLogger("selectivity.threads")

_lock = threading.Lock()
_running = 0
_restore: Any = None  # the first running computation's limiter: it restores the limits found


def _check(threads: int) -> None:
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads=}")


@contextmanager
def blas_limited(threads: int) -> Iterator[None]:
    """BLAS on at most ``threads`` threads in the whole process until the last computation that
    entered this block leaves it. Enter it on the event loop's thread."""
    global _running, _restore
    _check(threads)
    with _lock:
        if _running == 0:
            blas = ThreadpoolController().select(user_api="blas")  # anew: the libraries loaded
            _restore = blas.limit(limits=threads).__enter__()  # this thread controls OpenBLAS
            found = {i["num_threads"] for i in blas.info() if i["threading_layer"] != "openmp"}
            if found - {threads}:
                log.warning(
                    "BLAS is not limited to %d thread(s) (%s): another thread controls it",
                    threads,
                    sorted(found),
                )
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0:
                _restore.__exit__(None, None, None)
                _restore = None


@contextmanager
def openmp_limited(threads: int) -> Iterator[None]:
    """OpenMP (and an OpenMP-built BLAS) on at most ``threads`` threads in this thread."""
    _check(threads)
    per_thread = ThreadpoolController().select(user_api="openmp", threading_layer="openmp")
    with per_thread.limit(limits=threads):
        yield
