"""The heavy computations' thread limits (``service.core.threads``). The BLAS limit is the
process's and is set from the jobs' thread: overlapping computations keep it until the last one
ends, in whatever order they end, and the computations' threads run under it. The OpenMP limit
is per thread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np  # noqa: F401  (loads OpenBLAS, whose limit is checked)
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from service.core.threads import blas_limited, openmp_limited


def _threads(user_api: str) -> set[int]:
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == user_api}


def test_overlapping_audits_keep_the_blas_limit_until_the_last_ends() -> None:
    with threadpool_limits(limits=3, user_api="blas"):  # neither the limit nor the default
        assert _threads("blas") == {3}
        first, second = blas_limited(1), blas_limited(1)
        first.__enter__()
        second.__enter__()  # starts while the first runs
        with ThreadPoolExecutor(1) as pool:  # the computation's thread runs under the limit
            assert pool.submit(_threads, "blas").result() == {1}
        first.__exit__(None, None, None)  # the first ends while the second still runs
        assert _threads("blas") == {1}
        second.__exit__(None, None, None)
        assert _threads("blas") == {3}  # the last ends: the limit found before is back


def test_the_openmp_limit_is_the_computations_thread_only() -> None:
    import lightgbm  # noqa: F401  (loads an OpenMP runtime: libgomp)

    if not _threads("openmp"):
        pytest.skip("no OpenMP runtime loaded")
    inside: list[set[int]] = []
    done = threading.Event()
    with threadpool_limits(limits=3, user_api="openmp"):  # this thread's

        def compute() -> None:
            with threadpool_limits(limits=4, user_api="openmp"):  # the thread's own before
                with openmp_limited(1):
                    inside.append(_threads("openmp"))
                    done.wait(30)
                inside.append(_threads("openmp"))

        t = threading.Thread(target=compute)
        t.start()
        while not inside:
            threading.Event().wait(0.01)
        assert inside == [{1}] and _threads("openmp") == {3}  # this thread is not limited
        done.set()
        t.join(30)
    assert inside == [{1}, {4}]  # the computation's thread got its own limit back


def test_a_limit_below_one_is_refused() -> None:
    for limited in (blas_limited, openmp_limited):
        with pytest.raises(ValueError, match="threads must be >= 1, got threads=0"), limited(0):
            pass
