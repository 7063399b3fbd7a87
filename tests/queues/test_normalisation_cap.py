"""A candidate's text is capped after normalisation, not only as sent: NFKC makes 18
characters of U+FDFA, so 2,000 of them sent passed the old check and became 36,000."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.annotation import sampling
from service.core.annotation.sampling import NFKC_GROWTH, TextTooLong, canonical_text
from service.queues.schemas import MAX_TEXT_CHARS
from tests.conftest import Api
from tests.queues.test_queues import make_queue

# characters that decompose, compose, reorder, fold to several, or are white space
NASTY = (
    "aAeE iI\t\n\u0301\u0308\u0327\u0345\u0323\u1100\u1161\u11a8\uac00\u3131\u314f\ufdfa"
    "\u3300ßİΣς\u1e9e\ufb01\uff21\u00a8\u0385\u1fef`;\u037e\u0e33\u0f73\u0f71\u0f72\u09cb"
    "\u09be\u09c7\u0b3e\u0b47\u00a0\u2000\u3000Å\u212b\u0344\U0001d160"
)


def test_no_code_point_grows_more_than_the_bound() -> None:
    """``NFKC_GROWTH`` is the largest canonical form of one code point (only those NFKD or
    case folding change can grow)."""
    worst = 0
    for cp in range(0x110000):
        c = chr(cp)
        if 0xD800 <= cp < 0xE000 or (not unicodedata.decomposition(c) and c.casefold() == c):
            continue
        worst = max(worst, len(sampling._fold(c)))
    assert worst == NFKC_GROWTH


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=NASTY, max_size=400), st.integers(1, 500))
def test_the_capped_form_is_the_whole_form_or_refused(text: str, limit: int) -> None:
    whole = canonical_text(text)
    try:
        assert canonical_text(text, max_chars=limit) == whole
        assert len(whole) <= limit
    except TextTooLong as exc:
        assert len(whole) > limit and exc.limit == limit


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=NASTY, max_size=600))
def test_pieces_normalise_as_the_whole(text: str) -> None:
    assert "".join(sampling._fold(p) for p in sampling._pieces(text)) == sampling._fold(text)


def test_a_long_form_is_refused_near_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The work stops once the pieces normalised so far pass the limit: far fewer than all."""
    folded: list[int] = []
    fold = sampling._fold

    def counting(text: str) -> str:
        folded.append(len(text))
        return fold(text)

    monkeypatch.setattr(sampling, "_fold", counting)
    text = ("\ufdfa" + "a") * 1000  # 2,000 code points sent, 19,000 characters canonical
    with pytest.raises(TextTooLong, match="longer than 2000 characters after normalisation"):
        canonical_text(text, max_chars=2000)
    assert sum(folded) < 400  # of 2,000: about 2000 / 19 code points make 2,000 characters
    # within the bound it is not cut at all
    folded.clear()
    assert canonical_text("Straße " * 10, max_chars=2000).startswith("strasse strasse")
    assert folded == [70]


async def test_a_candidate_longer_than_the_limit_once_normalised_is_422(qapi: Api) -> None:
    q = await make_queue(qapi)
    url = f"/v1/queues/{q}/candidates"
    over = "\ufdfa" * 112  # 112 code points, 2,016 characters once normalised
    body = {"candidates": [{"text": "fine", "uncertainty": 0.5}, {"text": over, "uncertainty": 0}]}
    r = await qapi.post(url, "curator", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("candidates[1].text:") and str(MAX_TEXT_CHARS) in detail
    assert "\ufdfa" not in r.text and "صلى" not in r.text  # the text is never repeated
    # just under: accepted
    r = await qapi.post(
        url, "curator", json={"candidates": [{"text": "\ufdfa" * 111, "uncertainty": 0.5}]}
    )
    assert r.status_code == 200, r.text
