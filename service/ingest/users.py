"""User-level privacy at ingest (DESIGN §4): with ``privacy.user_key`` and
``max_contributions_per_window`` c, at most c observations of one user are counted per window
(the first c to arrive); the rest still go to the hot store (and so to the cold store) but
change no count. The sensitivities, hence the noise, are multiplied by c (``streams.runtime``).

Users are told apart by a keyed hash (BLAKE2b with the stream's hash seed) of their canonical
user-key value, so the per-window counters in Redis hold no raw identifier."""

from __future__ import annotations

import hashlib

import numpy as np
from redis.asyncio import Redis

from service.core.featurize import canonical_value, row_keys, table_keys
from service.core.sketch import cell_indices, hash_keys
from service.errors import ValidationError
from service.ingest.schemas import IngestIn
from service.keys import Keys
from service.lua import source
from service.streams.runtime import StreamRuntime


def user_hash(rt: StreamRuntime, value: object) -> str:
    spec = next(f for f in rt.features if f.name == rt.config.privacy.user_key)
    digest = hashlib.blake2b(
        canonical_value(value, spec),
        key=rt.hash_seed[:64],
        person=b"selectivity-usr",
        digest_size=16,
    )
    return digest.hexdigest()


def per_observation_ops(
    rt: StreamRuntime, body: IngestIn, table_ids: list[int]
) -> list[bytes | str]:
    """Per observation: its user hash, its prior cell, and its increments in each table of
    ``table_ids`` (not summed across observations: the script decides one by one)."""
    user_key = rt.config.privacy.user_key
    assert user_key is not None
    obs = body.observations
    missing = [i for i, o in enumerate(obs) if o.features.get(user_key) is None]
    if missing:
        raise ValidationError(
            f"observations[{missing[0]}].features.{user_key}: the stream's user key is required"
        )
    labels = np.fromiter((rt.label_index[o.label] for o in obs), dtype=np.int64, count=len(obs))
    values = row_keys([o.features for o in obs], rt.features)
    by_id = {t.id: t for t in rt.tables}
    per_table: list[list[bytes]] = []
    for tid in table_ids:
        t = by_id[tid]
        buckets, signs = hash_keys(
            table_keys(values, t.features), seed=rt.hash_seed, table=t.name, spec=rt.spec
        )
        cells = cell_indices(labels, buckets, rt.spec)
        per_table.append(
            [
                b" ".join(b"#%d %d" % (c, s) for c, s in zip(row_c, row_s, strict=True))
                for row_c, row_s in zip(cells.tolist(), signs.tolist(), strict=True)
            ]
        )
    args: list[bytes | str] = []
    for i, o in enumerate(obs):
        args.append(user_hash(rt, o.features[user_key]))
        args.append(b"#%d" % labels[i])
        args.extend(col[i] for col in per_table)
    return args


class UserBoundStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.k = keys
        self._script = redis.register_script(source("ingest_users"))

    async def apply(
        self,
        *,
        stream: str,
        window: int,
        token: str,
        table_ids: list[int],
        per_obs: list[bytes | str],
        n_obs: int,
        max_per_user: int,
        rows: list[bytes],
        response: bytes,
        ttl: int,
    ) -> tuple[str, bytes | None]:
        keys = [
            self.k.meta(stream, window),
            self.k.idem(stream, window, token),
            self.k.hot(stream, window),
            self.k.users(stream, window),
        ]
        keys += [self.k.table(stream, window, t) for t in table_ids]
        keys.append(self.k.prior(stream, window))
        args: list[bytes | int | str] = [
            ttl,
            response,
            len(table_ids),
            max_per_user,
            ttl,
            n_obs,
            *per_obs,
            len(rows),
            *rows,
        ]
        res = await self._script(keys=keys, args=args)
        status = res[0].decode() if isinstance(res[0], bytes) else str(res[0])
        return status, (res[1] if len(res) > 1 and status == "dup" else None)
