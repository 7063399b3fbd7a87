"""The counting job's digest cache holds raw values (the keys it hashed): it must not keep them
longer than the hot rows they came from. It belongs to one epoch and is dropped at the first
counting tick after a roll, even when no row comes (docs/ARCHITECTURE.md, "Threat model and
promises", 1)."""

from __future__ import annotations

from service.core.features import counting as core_counting
from service.core.features.runtime import StreamRuntime
from service.counting.service import count_all
from service.streams import service as streams
from tests.conftest import Api, Jobs
from tests.helpers import ingest, new_stream, obs


def _held_values(rt: StreamRuntime, epoch: int) -> set[bytes]:
    h = core_counting.hasher(rt.hash_seed, rt.spec, epoch=epoch)
    return {k for digests in h._digests.values() for k in digests}


async def test_values_hashed_by_counting_are_forgotten_at_the_next_epoch(
    api: Api, jobs: Jobs
) -> None:
    name = await new_stream(api, "keycache")
    user = "user-7f3a9c-only-in-window-1"
    assert await ingest(api, name, [obs(user, f"i{i}", 30 + i, "1") for i in range(5)]) == 1
    await count_all(api.ctx)
    rt = await streams.runtime(ctx=api.ctx, name=name)
    assert core_counting.cached_epochs(rt.hash_seed) == [1]
    assert any(user.encode() in k for k in _held_values(rt, 1))

    assert (await api.post(f"/v1/streams/{name}/roll")).json() == {"epoch": 2}
    await jobs()
    await count_all(api.ctx)  # a tick with no new row
    assert core_counting.cached_epochs(rt.hash_seed) == []
    # counting in the new epoch starts an empty cache: nothing of window 1 comes back
    assert await ingest(api, name, [obs("someone-else", "i9", 40, "0")]) == 2
    await count_all(api.ctx)
    assert core_counting.cached_epochs(rt.hash_seed) == [2]
    held = _held_values(rt, 2)
    assert held and not any(user.encode() in k for k in held)
