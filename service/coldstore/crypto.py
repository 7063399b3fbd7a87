"""The cold store's cryptography (docs/ARCHITECTURE.md, "Cold store and break-glass unlock"):
no I/O, no SQL, no Redis.

Keys. An X25519 key pair; the 32-byte private key is the SLIP-39 master secret, split by
``shamir-mnemonic`` into N mnemonic shares with threshold M (one group). The service stores the
public key and a verification tag, ``SHA-256("selectivity/coldstore-key/v1" || private key)``:
reconstructed shares are accepted only if they give back both (a wrong share set fails
SLIP-39's own checksum or gives a different secret).

Segments. A segment file is ::

    b"SLSEG1\\n" | uint32 big-endian header length | header (canonical JSON) | HPKE message

The header (format version 2) names the stream, window, the segment's number in its window
(``seq``), key id, codec and format version: nothing about the rows. Their count, first and last
entry ids (exact arrival times) and uncompressed size are sealed with them: the HPKE plaintext
is ``uint32 big-endian inner length | inner header (canonical JSON) | compressed body``, so no
exact per-window statistic is readable without the key (issue 12 item 2). Version 1 segments
(written before) carried ``first``, ``last``, ``count`` and ``size`` in the clear header and a
bare compressed body; they are still read. The HPKE message is RFC 9180 single-shot base
mode, suite X25519 / HKDF-SHA256 / AES-256-GCM (cryptography's ``hpke.Suite``), sealed to the
public key with ``info = b"selectivity/segment/v1" || header``: a changed header (or one
swapped in from another segment) makes the AEAD tag fail, so a segment opens only under its own
header. The rows are lines ``<entry id> <raw row JSON>``, compressed by the header's codec:
``zstd`` (level 3, pyarrow's codec; the inner header carries the uncompressed ``size``), or
``zlib`` in segments written before zstd (still read).

Padding: the compressed body is padded with zero bytes to a size bucket (``padded_size``: at
least 4 KiB, then steps of an eighth of the enclosing power of two), and the inner header holds
its true length (``zlen``), so that a segment's size (the file's, and ``cold_segment.size``)
tells its row count only to within about 12 % and not at all below 4 KiB of compressed rows,
at a storage cost of at most 12.5 % (issue 12 item 2).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import shamir_mnemonic
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

MAGIC = b"SLSEG1\n"
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
INNER_FIELDS = ("first", "last", "count")  # sealed with the rows since version 2
INFO_PREFIX = b"selectivity/segment/v1"
TAG_PREFIX = b"selectivity/coldstore-key/v1"
SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
MAX_HEADER = 4096


class SegmentError(Exception):
    """A segment that cannot be parsed or opened: tampered, truncated, or the wrong key."""


class ShareError(Exception):
    """Shares that are malformed or do not reconstruct the cold-store key."""


# -- keys ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewKey:
    public_key: bytes
    verification_tag: bytes
    shares: list[str]  # shown once, never stored by the service


def verification_tag(private_key: bytes) -> bytes:
    return hashlib.sha256(TAG_PREFIX + private_key).digest()


def generate_key(*, shares: int, threshold: int) -> NewKey:
    """A fresh key pair, split into ``shares`` SLIP-39 mnemonics of which ``threshold`` open it.
    The private key exists only inside this call (and in the shares it returns)."""
    if not 1 <= threshold <= shares <= 16:
        raise ValueError("need 1 <= threshold <= shares <= 16 (SLIP-39's limit)")
    if threshold == 1 and shares > 1:
        raise ValueError("SLIP-39 allows threshold 1 only with a single share")
    sk = X25519PrivateKey.generate()
    raw = sk.private_bytes_raw()
    mnemonics = shamir_mnemonic.generate_mnemonics(1, [(threshold, shares)], raw)[0]
    return NewKey(
        public_key=sk.public_key().public_bytes_raw(),
        verification_tag=verification_tag(raw),
        shares=list(mnemonics),
    )


def normalise_share(share: str) -> str:
    return " ".join(share.lower().split())


def check_share(share: str) -> tuple[int, int, int]:
    """Parse one mnemonic (its words and checksum); returns (identifier, member index,
    member threshold). Raises ShareError with a message that never repeats the words."""
    try:
        parsed = shamir_mnemonic.share.Share.from_mnemonic(normalise_share(share))
    except Exception as exc:  # MnemonicError, or words outside the list
        raise ShareError(f"not a valid SLIP-39 share ({type(exc).__name__})") from None
    return parsed.identifier, parsed.index, parsed.member_threshold


def combine(shares: Sequence[str], *, public_key: bytes, tag: bytes) -> X25519PrivateKey:
    """Reconstruct the private key and check it against the stored public key and tag."""
    try:
        raw = shamir_mnemonic.combine_mnemonics([normalise_share(s) for s in shares])
    except Exception as exc:
        raise ShareError(f"the shares do not combine ({type(exc).__name__})") from None
    try:
        sk = X25519PrivateKey.from_private_bytes(raw)
        ok = hmac.compare_digest(verification_tag(raw), tag) and hmac.compare_digest(
            sk.public_key().public_bytes_raw(), public_key
        )
    finally:
        raw = b""  # drop our reference; the key now lives only in the OpenSSL object
    if not ok:
        raise ShareError("the shares do not reconstruct this cold-store key")
    return sk


def public_key_of(raw: bytes) -> X25519PublicKey:
    return X25519PublicKey.from_public_bytes(raw)


def private_key_bytes(sk: X25519PrivateKey) -> bytes:
    return sk.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


# -- segments -----------------------------------------------------------------------------


def header_bytes(header: dict[str, Any]) -> bytes:
    return orjson.dumps(header, option=orjson.OPT_SORT_KEYS)


def encode_rows(entries: Sequence[tuple[bytes, bytes]]) -> bytes:
    return b"\n".join(eid + b" " + row for eid, row in entries)


def seal(
    header: dict[str, Any], entries: Sequence[tuple[bytes, bytes]], public_key: bytes
) -> bytes:
    """One segment file's bytes: ``entries`` are (stream entry id, raw row JSON). The fields
    of ``header`` that describe the rows (``first``, ``last``, ``count``) and the uncompressed
    size go inside the encrypted part; the rest is the clear (authenticated) header."""
    plain = encode_rows(entries)
    outer = {k: v for k, v in header.items() if k not in INNER_FIELDS}
    hdr = header_bytes({**outer, "v": FORMAT_VERSION, "codec": "zstd"})
    inner = header_bytes(
        {**{k: header[k] for k in INNER_FIELDS if k in header}, "size": len(plain)}
    )
    if len(hdr) > MAX_HEADER or len(inner) > MAX_HEADER:
        raise ValueError("segment header too long")
    packed = _ZSTD.compress(plain, asbytes=True)
    inner = header_bytes({**orjson.loads(inner), "zlen": len(packed)})
    body = struct.pack(">I", len(inner)) + inner + packed
    body += bytes(padded_size(len(body)) - len(body))
    sealed = SUITE.encrypt(body, public_key_of(public_key), info=INFO_PREFIX + hdr)
    return MAGIC + struct.pack(">I", len(hdr)) + hdr + sealed


def padded_size(n: int) -> int:
    """The size bucket of a segment body of ``n`` bytes: 4096 at least; above, the next
    multiple of an eighth of the largest power of two not above ``n`` (so the padding is
    under 12.5 % and a bucket spans about 12 % of sizes)."""
    if n <= MIN_PADDED:
        return MIN_PADDED
    step = (1 << (n.bit_length() - 1)) // 8
    return -(-n // step) * step


MIN_PADDED = 4096
_ZSTD = pa.Codec("zstd", compression_level=3)  # ~12x zlib level 6's speed, a better ratio
MAX_PLAIN = 1 << 30  # the largest uncompressed segment body a header may announce


def _decompress(header: dict[str, Any], body: bytes) -> bytes:
    codec = header.get("codec")
    if codec == "zlib":
        return zlib.decompress(body)
    size = header.get("size")
    if codec != "zstd" or not isinstance(size, int) or not 0 <= size <= MAX_PLAIN:
        raise SegmentError(f"unknown segment codec {codec!r} or size")
    try:
        return _ZSTD.decompress(body, decompressed_size=size, asbytes=True)
    except (OSError, ValueError, pa.ArrowException):
        raise SegmentError("the segment body does not decompress") from None


def split(data: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    """(header, header bytes, HPKE message) of a segment file, without decrypting."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise SegmentError("not a segment file (bad magic)")
    (n,) = struct.unpack_from(">I", data, len(MAGIC))
    start = len(MAGIC) + 4
    if n > MAX_HEADER or start + n > len(data):
        raise SegmentError("segment header length out of range")
    hdr = data[start : start + n]
    try:
        header = orjson.loads(hdr)
    except orjson.JSONDecodeError:
        raise SegmentError("segment header is not JSON") from None
    if not isinstance(header, dict) or header.get("v") not in READ_VERSIONS:
        raise SegmentError("unknown segment format version")
    return header, hdr, data[start + n :]


def open_segment(
    data: bytes, private_key: X25519PrivateKey
) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """Decrypt and decompress: (header, [(entry id, raw row JSON)]). Raises SegmentError if
    any byte of the file, the header included, was changed."""
    header, hdr, sealed = split(data)
    try:
        body = SUITE.decrypt(sealed, private_key, info=INFO_PREFIX + hdr)
    except (InvalidTag, ValueError):
        raise SegmentError("authentication failed: the segment or its header was altered") from None
    if header.get("v") != 1:  # the row statistics are sealed with the rows
        inner = _inner(body)
        header = {**header, **{k: v for k, v in inner.items() if k != "zlen"}}
        body = body[4 + struct.unpack_from(">I", body)[0] :]
        zlen = inner.get("zlen")
        if zlen is not None:  # the padding cut off
            if not isinstance(zlen, int) or not 0 <= zlen <= len(body):
                raise SegmentError("inner header length of the rows out of range")
            body = body[:zlen]
    rows = []
    for line in _decompress(header, body).split(b"\n"):
        eid, _, row = line.partition(b" ")
        rows.append((eid.decode(), row))
    if len(rows) != header.get("count"):
        raise SegmentError("entry count does not match the header")
    return header, rows


def _inner(body: bytes) -> dict[str, Any]:
    if len(body) < 4:
        raise SegmentError("segment body too short")
    (n,) = struct.unpack_from(">I", body)
    if n > MAX_HEADER or 4 + n > len(body):
        raise SegmentError("inner header length out of range")
    try:
        inner = orjson.loads(body[4 : 4 + n])
    except orjson.JSONDecodeError:
        raise SegmentError("inner header is not JSON") from None
    if not isinstance(inner, dict):
        raise SegmentError("inner header is not an object")
    return {k: inner.get(k) for k in (*INNER_FIELDS, "size", "zlen")}
