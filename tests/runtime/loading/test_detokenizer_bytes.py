"""The streaming detokenizer against a plain decode of byte tokens: its deltas always add up to the decode of all
ids, and a run of bytes that never make a character does not hold its window open (which made each step decode the
whole run: quadratic on the server's event loop)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer


class ByteDecoder:
    """Token id = one byte (0-255), or a multi-byte token from `merged`; decoded as byte-level BPE does, each
    invalid sequence a U+FFFD. Counts the ids it decodes."""

    def __init__(self, merged: Sequence[bytes] = ()) -> None:
        self.vocab = [bytes([b]) for b in range(256)] + list(merged)
        self.decoded = 0

    def __call__(self, ids: Sequence[int]) -> str:
        self.decoded += len(ids)
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")


def _stream(decode: ByteDecoder, ids: Sequence[int]) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(decode)
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.flush())
    return deltas, detok


def test_a_run_of_lone_continuation_bytes_streams_in_linear_work() -> None:
    decode = ByteDecoder()
    ids = [0x80] * 2000 + list("€ ok".encode())
    deltas, detok = _stream(decode, ids)
    assert "".join(deltas) == detok.text == decode(ids) == "\ufffd" * 2000 + "€ ok"
    assert decode.decoded < 40 * len(ids)  # before: the whole run, again at every step (about len(ids) ** 2)
    assert sum(len(d) for d in deltas[:100]) > 80  # emitted as it comes, not at the end


def test_characters_split_over_tokens_among_bad_bytes_come_out_whole() -> None:
    # Multi-byte tokens that end inside the next character, one after another: every boundary is inside a character
    # while the text keeps ending in an incomplete one, so no boundary there may be emitted early.
    chain = [b"\xf0", b"\x9f\x99", b"\x82\xf0", b"\x82"]  # 🙂 = f0 9f 99 82
    decode = ByteDecoder(chain)
    first, middle, next_one, last = range(256, 256 + len(chain))
    smiles = [first] + [middle, next_one] * 12 + [middle, last]  # 13 smiles; no boundary between them is clean
    ids = [0x80] * 9 + [0xF0, 0x9F, 0x99, 0x82] + [0x80] * 12 + smiles + [0x80] * 10 + [0xE2, 0x82, 0xAC]
    deltas, _ = _stream(decode, ids)
    assert "".join(deltas) == decode(ids)
    assert "\ufffd" + "🙂" * 13 + "\ufffd" in decode(ids) and "🙂" in "".join(deltas[:14])


@given(st.lists(st.integers(0, 255), max_size=120), st.lists(st.binary(min_size=2, max_size=3), max_size=6))
def test_the_deltas_add_up_to_the_decode_of_every_id(raw: list[int], merged: list[bytes]) -> None:
    decode = ByteDecoder(merged)
    ids = [b if i % 5 or not merged else 256 + b % len(merged) for i, b in enumerate(raw)]
    deltas, detok = _stream(decode, ids)
    assert "".join(deltas) == detok.text == decode(ids)


@given(
    st.lists(st.integers(0, 255), max_size=8),
    st.lists(st.integers(0, 255), max_size=40),
    st.lists(st.binary(min_size=2, max_size=3), max_size=6),
)
def test_after_a_prompt_the_stream_adds_up_to_the_result_and_to_the_whole_decode(
    prompt: list[int], out: list[int], merged: list[bytes]
) -> None:
    """After a prompt (which may end inside a character: its first bytes), fed one token at a time, the deltas join
    to `text_after`, the result's text; and prompt text + output text is the decode of both, where the prompt's text
    is its decode less the bytes the output completed (those are the output's)."""
    from radixcache.runtime.loading.detokenizer import text_after

    decode = ByteDecoder(merged)
    ids = [b if i % 4 or not merged else 256 + b % len(merged) for i, b in enumerate(out)]
    detok = IncrementalDetokenizer(decode, prompt)
    joined = "".join(detok.add(i) for i in ids) + detok.flush()
    assert joined == detok.text == text_after(decode, prompt, ids)
    whole = decode(prompt + ids)
    assert whole.endswith(joined)
    assert decode(prompt).startswith(whole[: len(whole) - len(joined)].rstrip("\ufffd"))
