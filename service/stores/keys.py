"""Redis key names. Every key of one partition of a (stream, window) shares a hash tag,
``{<stream>:<window>}`` for partition 0 and ``{<stream>:<window>:<p>}`` for partition p ≥ 1
(a stream of one partition has today's names only), and every stream-level key the tag
``{<stream>}``, so the service works on Redis Cluster and a cluster spreads one window's
partitions over its masters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    # stream level
    def epoch(self, s: str) -> str:
        return f"{self.prefix}:{{{s}}}:epoch"

    def served(self, s: str) -> str:
        return f"{self.prefix}:{{{s}}}:served"

    def agg(self, s: str, epoch: int) -> str:
        return f"{self.prefix}:{{{s}}}:agg:{epoch}"

    def idem_pointer(self, s: str, token: str) -> str:
        """The window an Idempotency-Key's batch went to (``token`` its keyed token), with a
        TTL (``service.stores.ingest``)."""
        return f"{self.prefix}:{{{s}}}:idk:{token}"

    def idem_count(self, s: str, bucket: int) -> str:
        """How many Idempotency-Key pointers the stream made in time bucket ``bucket``."""
        return f"{self.prefix}:{{{s}}}:idkn:{bucket}"

    def lock(self, s: str, what: str) -> str:
        return f"{self.prefix}:{{{s}}}:lock:{what}"

    # window level: partition p of window w
    @staticmethod
    def _tag(s: str, w: int, p: int) -> str:
        return f"{{{s}:{w}}}" if p == 0 else f"{{{s}:{w}:{p}}}"

    def meta(self, s: str, w: int, p: int = 0) -> str:
        return f"{self.prefix}:{self._tag(s, w, p)}:meta"

    def table(self, s: str, w: int, table_id: int, p: int = 0) -> str:
        return f"{self.prefix}:{self._tag(s, w, p)}:t:{table_id}"

    def prior(self, s: str, w: int, p: int = 0) -> str:
        return f"{self.prefix}:{self._tag(s, w, p)}:prior"

    def hot(self, s: str, w: int, p: int = 0) -> str:
        return f"{self.prefix}:{self._tag(s, w, p)}:hot"

    def cols(self, s: str, w: int, p: int = 0) -> str:
        """The counted hot rows by column (``service.core.features.hotrows.to_ipc``), a list."""
        return f"{self.prefix}:{self._tag(s, w, p)}:cols"

    def batches(self, s: str, w: int, p: int = 0) -> str:
        """The accepted batches not yet counted, whole, in entry order (a list; ingest.lua
        appends, count.lua pops)."""
        return f"{self.prefix}:{self._tag(s, w, p)}:batches"

    def batch_ids(self, s: str, w: int, p: int = 0) -> str:
        """Beside ``batches``, element for element: each batch's ``<first id> <last id>
        <rows>``."""
        return f"{self.prefix}:{self._tag(s, w, p)}:batch-ids"

    def stage(self, s: str, w: int, token: str, table_id: int, p: int = 0) -> str:
        """A count table's new cells written by one counting run before its compare-and-set."""
        return f"{self.prefix}:{self._tag(s, w, p)}:stage:{token}:{table_id}"

    def users(self, s: str, w: int, p: int = 0) -> str:
        """Per-user observation counters of a window (keyed hashes of user ids, never raw)."""
        return f"{self.prefix}:{self._tag(s, w, p)}:users"

    def idem_window(self, s: str, w: int, p: int = 0) -> str:
        """The window's accepted keyed batches: a hash, keyed token -> keyed fingerprint and
        response (``service.stores.ingest``); expires idempotency_ttl_seconds after its last
        record."""
        return f"{self.prefix}:{self._tag(s, w, p)}:idem"

    def idem(self, s: str, w: int, token: str, p: int = 0) -> str:
        """A batch's record as written before keyed fingerprints (one string per batch, with a
        TTL, ``token`` the SHA-256 of its Idempotency-Key): read, never written (only part 0
        can hold one: parts came later)."""
        return f"{self.prefix}:{self._tag(s, w, p)}:idem:{token}"

    def window_pattern(self, s: str, w: int, p: int = 0) -> str:
        return f"{self.prefix}:{self._tag(s, w, p)}:*"

    # annotation queue level: every key of a queue shares the tag {q:<queue>}
    def queue(self, q: str, what: str) -> str:
        """``what``: p:<period>:counts, p:<period>:ready, periods, closed, released, pool,
        scores, leases, owners, tasks, labelled, stats."""
        return f"{self.prefix}:{{q:{q}}}:{what}"

    def queue_skipped(self, q: str, owner: str) -> str:
        return f"{self.prefix}:{{q:{q}}}:skipped:{owner}"

    def queue_pattern(self, q: str) -> str:
        return f"{self.prefix}:{{q:{q}}}:*"

    # anonymization level: every key of one run shares the tag {an:<id>}
    def anonymization(self, a: str, what: str) -> str:
        """``what``: meta (a hash), input (inline rows while the job needs them), result."""
        return f"{self.prefix}:{{an:{a}}}:{what}"

    # per API key (service.stores.quotas): a token bucket per endpoint class, a counter per kind
    def rate(self, key_id: str, cls: str) -> str:
        return f"{self.prefix}:{{rate:{key_id}}}:{cls}"

    def quota(self, key_id: str, kind: str) -> str:
        return f"{self.prefix}:{{quota:{key_id}}}:{kind}"
