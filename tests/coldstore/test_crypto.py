"""The segment format and the key shares, without I/O."""

from __future__ import annotations

import itertools

import pytest

from service.coldstore import crypto

ROWS = [
    (b"1700000000000-0", b'{"id":"a","f":{"u":"x"},"y":"1","t":null}'),
    (b"1700000000000-1", b"{}"),
]


@pytest.fixture(scope="module")
def key() -> crypto.NewKey:
    return crypto.generate_key(shares=3, threshold=2)


def header(**over: object) -> dict[str, object]:
    h: dict[str, object] = {
        "stream": "s",
        "stream_id": 1,
        "window": 4,
        "first": "a",
        "last": "b",
        "count": 2,
        "key_id": 1,
    }
    h.update(over)
    return h


def test_any_two_of_three_shares_open_a_segment(key: crypto.NewKey) -> None:
    data = crypto.seal(header(), ROWS, key.public_key)
    for pair in itertools.combinations(key.shares, 2):
        sk = crypto.combine(pair, public_key=key.public_key, tag=key.verification_tag)
        hdr, rows = crypto.open_segment(data, sk)
        assert hdr["window"] == 4
        assert rows == [(e.decode(), r) for e, r in ROWS]


def test_one_share_is_not_enough(key: crypto.NewKey) -> None:
    with pytest.raises(crypto.ShareError):
        crypto.combine(key.shares[:1], public_key=key.public_key, tag=key.verification_tag)


def test_shares_of_another_key_are_refused(key: crypto.NewKey) -> None:
    other = crypto.generate_key(shares=3, threshold=2)
    with pytest.raises(crypto.ShareError, match="do not reconstruct"):
        crypto.combine(other.shares[:2], public_key=key.public_key, tag=key.verification_tag)
    with pytest.raises(crypto.ShareError):  # mixed sets fail SLIP-39's own checks
        crypto.combine(
            [key.shares[0], other.shares[1]], public_key=key.public_key, tag=key.verification_tag
        )


def test_a_mistyped_share_is_caught_by_its_checksum(key: crypto.NewKey) -> None:
    words = key.shares[0].split()
    words[5] = "academic" if words[5] != "academic" else "acid"
    with pytest.raises(crypto.ShareError) as err:
        crypto.check_share(" ".join(words))
    assert words[5] not in str(err.value)  # errors never repeat the words


def test_plaintext_is_not_in_the_file_and_any_flipped_byte_is_detected(key: crypto.NewKey) -> None:
    data = crypto.seal(header(), ROWS, key.public_key)
    assert b'"u":"x"' not in data and b"1700000000000-1" not in data
    sk = crypto.combine(key.shares[1:], public_key=key.public_key, tag=key.verification_tag)
    start = len(crypto.MAGIC) + 4
    for pos in [start + 3, len(data) // 2, len(data) - 1]:  # header, body, tag
        bad = bytearray(data)
        bad[pos] ^= 0x01
        with pytest.raises(crypto.SegmentError):
            crypto.open_segment(bytes(bad), sk)


def test_a_header_from_another_segment_does_not_open(key: crypto.NewKey) -> None:
    a = crypto.seal(header(window=4), ROWS, key.public_key)
    b = crypto.seal(header(window=5), ROWS, key.public_key)
    ha, hdr_a, body_a = crypto.split(a)
    hb, hdr_b, body_b = crypto.split(b)
    swapped = a[: len(crypto.MAGIC)] + len(hdr_b).to_bytes(4, "big") + hdr_b + body_a
    sk = crypto.combine(key.shares[:2], public_key=key.public_key, tag=key.verification_tag)
    with pytest.raises(crypto.SegmentError, match="altered"):
        crypto.open_segment(swapped, sk)


def test_limits() -> None:
    with pytest.raises(ValueError):
        crypto.generate_key(shares=2, threshold=3)
    with pytest.raises(ValueError):
        crypto.generate_key(shares=17, threshold=2)


def _sealed_as(header_: dict[str, object], body: bytes, public_key: bytes) -> bytes:
    """A segment file with this header and compressed body, sealed as ``crypto.seal`` does."""
    import struct

    hdr = crypto.header_bytes(header_)
    sealed = crypto.SUITE.encrypt(
        body, crypto.public_key_of(public_key), info=crypto.INFO_PREFIX + hdr
    )
    return crypto.MAGIC + struct.pack(">I", len(hdr)) + hdr + sealed


def test_segments_are_zstd_and_earlier_zlib_segments_still_open(key: crypto.NewKey) -> None:
    import zlib

    sk = crypto.combine(key.shares[:2], public_key=key.public_key, tag=key.verification_tag)
    new, _ = crypto.open_segment(crypto.seal(header(), ROWS, key.public_key), sk)
    assert new["codec"] == "zstd" and new["size"] == len(crypto.encode_rows(ROWS))
    plain = crypto.encode_rows(ROWS)
    old = _sealed_as({**header(), "v": 1, "codec": "zlib"}, zlib.compress(plain, 6), key.public_key)
    assert crypto.open_segment(old, sk)[1] == [(e.decode(), r) for e, r in ROWS]
    for bad in (
        {**header(), "v": 1, "codec": "zstd"},  # no size
        {**header(), "v": 1, "codec": "zstd", "size": 2**40},  # a decompression bomb
        {**header(), "v": 1, "codec": "lzma", "size": len(plain)},
    ):
        with pytest.raises(crypto.SegmentError):
            crypto.open_segment(_sealed_as(bad, zlib.compress(plain), key.public_key), sk)


def test_segment_sizes_are_padded_to_buckets_that_hide_the_row_count(key: crypto.NewKey) -> None:
    """Issue 12 item 2: a segment's size must not tell its window's row count. Segments of 1
    and of 30 rows have the same size; larger ones fall in buckets an eighth of a power of two
    wide, padded by under 12.5 %; the rows still open exactly."""

    def segment(n: int, width: int = 80) -> bytes:
        rows = [
            (f"1-{i}".encode(), b'{"f": {"u": "%d"}, "y": "1"}' % (i * 7919 % 10**width))
            for i in range(n)
        ]
        header = {
            "stream": 1,
            "window": 1,
            "seq": 1,
            "key": 1,
            "first": "1-0",
            "last": f"1-{n - 1}",
            "count": n,
        }
        return crypto.seal(header, rows, key.public_key)

    assert len(segment(1)) == len(segment(30))
    for n in (1, 30, 500, 5000):
        data = segment(n)
        _, rows = crypto.open_segment(
            data,
            crypto.combine(key.shares[:2], public_key=key.public_key, tag=key.verification_tag),
        )
        assert len(rows) == n
    for n in (1, 4096, 4097, 5000, 65_537, 10**6):
        size = crypto.padded_size(n)
        assert size >= n and size - n < max(4096, n // 8 + 1)
        assert crypto.padded_size(size) == size  # a bucket's own size stays in it
    sizes = {crypto.padded_size(n) for n in range(4097, 8193)}
    assert len(sizes) == 8  # 4 KiB … 8 KiB in eight buckets
