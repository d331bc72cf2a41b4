"""Stop strings against a naive reference: the request ends at the first token whose output text, decoded whole,
holds a stop string, and its text is cut where the earliest one starts. The engine searches only the text each token
adds (decoding the whole output at every token made a long reply with stop strings quadratic)."""

from __future__ import annotations

import random

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.sampling import find_stop
from radixcache.runtime.testing import RandomModel

PROMPT = "hello there"


def _reference(decode, ids: tuple[int, ...], stops: list[str]) -> tuple[int, str] | None:
    """(tokens kept, text) of a run cut by `stops`, decoding the whole output after each token; None: no stop."""
    for k in range(1, len(ids) + 1):
        text = decode(list(ids[:k]))
        if (cut := find_stop(text, stops)) is not None:
            return k, text[:cut]
    return None


def test_stop_strings_end_the_request_where_a_whole_decode_finds_them(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    probe = engine.generate(PROMPT, 80, ignore_eos=True)
    text, rng = probe.text, random.Random(3)
    assert len(text) >= 60
    cases = [[text[i : i + n]] for i, n in ((0, 1), (5, 3), (40, 7), (70, 10))]
    for _ in range(12):  # several stops at once, of different lengths, overlapping, one absent
        stops = [text[i : i + rng.randint(1, 9)] for i in (rng.randrange(len(text) - 10) for _ in range(3))]
        cases.append([*stops, "\x01never"])
    for stops in cases:
        expected = _reference(tiny.tokenizer.decode, probe.token_ids, stops)
        assert expected is not None
        out = engine.generate(PROMPT, 80, stop=stops, ignore_eos=True)
        assert (out.finish_reason, len(out.token_ids), out.text) == ("stop", *expected), stops
        assert out.token_ids == probe.token_ids[: expected[0]]
    engine.cache.check_invariants()
    assert engine.cache.locked_blocks == 0


def test_a_stop_string_that_never_comes_costs_no_whole_decode_per_token(
    tiny: RandomModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    decoded: list[int] = []
    decode = tiny.tokenizer.decode
    monkeypatch.setattr(tiny.tokenizer, "decode", lambda ids, *a, **k: decoded.append(len(ids)) or decode(ids, *a, **k))
    out = engine.generate(PROMPT, 400, stop=["\x01never"], ignore_eos=True)
    assert len(out.token_ids) == 400 and out.finish_reason == "length"
    assert out.text == decode(list(out.token_ids))
    # The result decodes the output once; the stop search a few tokens a step (before: the whole output each step,
    # about 400 * 400 / 2 ids).
    assert sum(decoded) < 20 * 400
