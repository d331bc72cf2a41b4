"""`Engine.record_trace`: one Mooncake line per request served, with page hashes recomputed here independently,
written in arrival order as requests leave, and a write error that stops the recording but never a request."""

from __future__ import annotations

import json
import logging
import struct
from hashlib import blake2b
from pathlib import Path
from types import SimpleNamespace

import pytest

from radixcache.runtime.engine.engine import Engine
from radixcache.runtime.engine.trace_recorder import TraceRecorder, record_to

KEYS = {"timestamp", "input_length", "output_length", "hash_ids", "block_size", "output_hash_ids", "finish_timestamp"}


def chained_ids(tokens: list[int], page: int, fingerprint: str, namespace: object = None) -> list[int]:
    """The trace ids of every page of `tokens` (a partial last one too), computed from the documented scheme: blake2b
    (16 bytes) of the previous page's hash and the page's int64 ids, from a root over the fingerprint and namespace;
    an id is the hash's first 8 bytes, big-endian, masked to 63 bits."""
    prev = blake2b(b"radixcache-page-v1\0" + fingerprint.encode() + b"\0" + repr(namespace).encode(), digest_size=16)
    digest = prev.digest()
    ids = []
    for start in range(0, len(tokens), page):
        chunk = tokens[start : start + page]
        digest = blake2b(digest + struct.pack(f"={len(chunk)}q", *chunk), digest_size=16).digest()
        ids.append(int.from_bytes(digest[:8], "big") & (2**63 - 1))
    return ids


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def fake_request(arrival: float, prompt: list[int], output: list[int], **extra: object) -> SimpleNamespace:
    fields = {"namespace": None, "session": None, "retain_for": None, "t_admitted": arrival, "error": None}
    fields |= {"t_arrival": arrival, "prompt_ids": prompt, "output_ids": output}
    fields |= {"kv": SimpleNamespace(num_kv=len(prompt) + len(output) - 1), **extra}
    return SimpleNamespace(**fields)


def test_a_line_holds_the_chained_hashes_of_the_prompt_and_of_the_computed_output_pages(tiny, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    prompt = [5, 9, 2, 7, 1, 3, 8, 4, 6, 11]  # two whole pages of 4 and a partial one
    with Engine(tiny, capacity_blocks=64, page_size=4) as engine:
        recorder = engine.record_trace(path)
        result = engine.generate(prompt, 7, ignore_eos=True, session="conv-1")
        other = engine.generate(prompt, 2, ignore_eos=True, namespace="tenant-b")
        assert len(lines(path)) == 2  # written as the requests left, not at close
        fingerprint = engine.fingerprint
    assert recorder is not None and not recorder.recording  # the engine's close closed it
    first, second = lines(path)
    assert set(first) == KEYS | {"session_id"} and set(second) == KEYS
    output = list(result.token_ids)
    assert (first["input_length"], first["output_length"], first["block_size"]) == (10, 7, 4)
    assert first["hash_ids"] == chained_ids(prompt, 4, fingerprint)
    kv_pages = (len(prompt) + len(output) - 1) // 4  # the last generated token has no KV
    assert first["output_hash_ids"] == chained_ids(prompt + output, 4, fingerprint)[2:kv_pages]
    assert len(first["output_hash_ids"]) == 2 and first["session_id"] == "conv-1"
    assert second["hash_ids"] == chained_ids(prompt, 4, fingerprint, "tenant-b")
    assert set(second["hash_ids"]).isdisjoint(first["hash_ids"])  # tenants never share a page
    assert all(0 <= i < 2**63 for line in (first, second) for i in line["hash_ids"] + line["output_hash_ids"])
    assert 0 <= first["timestamp"] <= first["finish_timestamp"] <= second["timestamp"] <= second["finish_timestamp"]
    assert len(other.token_ids) == 2


def test_a_request_that_finishes_first_is_written_after_one_that_arrived_before_it(tiny, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with Engine(tiny, capacity_blocks=128, page_size=4) as engine:
        engine.record_trace(path)
        long = engine.submit(list(range(1, 30)), 24, ignore_eos=True, session="long")
        short = engine.submit(list(range(40, 50)), 1, session="short")
        short_result, long_result = short.result(60), long.result(60)
        assert long_result.latency_s > short_result.latency_s
        written = lines(path)
    assert [line["session_id"] for line in written] == ["long", "short"]
    assert written[0]["timestamp"] <= written[1]["timestamp"]
    # The short one arrived second and left first: its finish time says so, for the simulator to replay.
    assert written[1]["timestamp"] <= written[1]["finish_timestamp"] <= written[0]["finish_timestamp"]


def test_lines_wait_for_earlier_arrivals_and_a_late_comer_keeps_the_order(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    times = iter([100.0, 100.75, 101.5, 100.2])  # the recorder's start, then each call of `left`
    recorder = TraceRecorder(path, 4, "fp", clock=lambda: next(times))
    early, late = fake_request(100.25, [1, 2, 3, 4, 5], [6, 7]), fake_request(100.5, [9, 9, 9], [1])
    recorder.left([late], pending_since=100.25)  # the early one still runs: the late one's line waits
    assert path.read_text() == ""
    recorder.left([early], pending_since=None)
    assert [line["timestamp"] for line in lines(path)] == [250, 500]
    assert [line["finish_timestamp"] for line in lines(path)] == [1500, 750]  # as each left, in any order
    straggler = fake_request(100.1, [3, 3], [3])  # reached the engine after `late` was written
    recorder.left([straggler], pending_since=None)  # and "left" at 200 ms: never before its raised timestamp
    assert (lines(path)[-1]["timestamp"], lines(path)[-1]["finish_timestamp"]) == (500, 500)
    recorder.close()
    recorder.close()  # harmless


def test_requests_that_were_never_admitted_or_failed_are_not_written(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(path, 4)
    queued = fake_request(1.0, [1, 2], [], t_admitted=None)
    failed = fake_request(1.0, [1, 2], [3], error=RuntimeError("boom"))
    recorder.left([queued, failed], pending_since=None)
    recorder.close()
    assert path.read_text() == "" and recorder.written == 0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_write_error_stops_the_recording_with_one_warning_and_the_engine_serves_on(
    tiny, caplog: pytest.LogCaptureFixture
) -> None:
    with Engine(tiny, capacity_blocks=64, page_size=4) as engine:
        recorder = engine.record_trace("/dev/full")  # every write fails with ENOSPC
        with caplog.at_level(logging.WARNING, logger="radixcache.record"):
            results = [engine.generate([1, 2, 3, 4, 5, 6], 3, ignore_eos=True) for _ in range(3)]
        assert [len(r.token_ids) for r in results] == [3, 3, 3]
    assert recorder is not None and not recorder.recording and recorder.written == 0
    assert recorder.dropped == 3
    warnings = [r for r in caplog.records if r.name == "radixcache.record"]
    assert len(warnings) == 1 and "stopped" in warnings[0].getMessage()


def test_record_trace_none_stops_and_a_bad_path_raises_at_once(tiny, tmp_path: Path) -> None:
    with Engine(tiny, capacity_blocks=64, page_size=4) as engine:
        with pytest.raises(OSError):
            engine.record_trace(tmp_path / "missing" / "t.jsonl")
        recorder = engine.record_trace(tmp_path / "t.jsonl")
        engine.generate([1, 2, 3], 2)
        assert engine.record_trace(None) is None
        assert recorder is not None and not recorder.recording and recorder.written == 1
        engine.generate([1, 2, 3], 2)  # not recorded
    assert len(lines(tmp_path / "t.jsonl")) == 1


def test_on_first_line_runs_once_after_the_first_line_and_what_it_raises_stops_the_recording(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve --record-trace` moves its staging file onto FILE from `on_first_line`: called once the first line is
    in the file, and a failure there (the move refused) stops the recording with one warning, out of `close` too."""
    path = tmp_path / "t.jsonl"
    recorder, seen = TraceRecorder(path, 4), []
    recorder.on_first_line = lambda: seen.append(path.read_text().count("\n"))
    recorder.left([fake_request(1.0, [1, 2], [3]), fake_request(1.1, [1, 2], [4])], pending_since=None)
    recorder.left([fake_request(1.2, [1, 2], [5])], pending_since=None)
    recorder.close()
    assert seen == [1] and recorder.written == 3

    def refuse() -> None:
        raise OSError("cannot move the recording onto FILE")

    failing = TraceRecorder(tmp_path / "u.jsonl", 4)
    failing.on_first_line = refuse
    failing.left([fake_request(1.0, [1, 2], [3])], pending_since=0.5)  # held for an earlier arrival: written at close
    with caplog.at_level(logging.WARNING, logger="radixcache.record"):
        failing.close()
    assert not failing.recording and failing.written == 1
    warnings = [r for r in caplog.records if r.name == "radixcache.record"]
    assert len(warnings) == 1 and "cannot move the recording onto FILE" in warnings[0].getMessage()


def test_recording_again_to_the_same_file_starts_it_clean(tmp_path: Path) -> None:
    """record_trace(path) again while the recording of that path held a line (a request that left while one that
    arrived before it still ran): the new recorder truncated the file, then the old one wrote its held line at its
    own offset, after a run of NUL bytes that the new recording's lines did not cover: no JSONL reader took it."""
    path = tmp_path / "t.jsonl"
    loop = SimpleNamespace(recorder=None)
    old = record_to(loop, path, 4, "fp")
    assert old is not None and loop.recorder is old
    old.left([fake_request(0.0, list(range(1, 400)), [1] * 40) for _ in range(5)], pending_since=None)
    early, late = fake_request(1.0, [1, 2, 3], [4]), fake_request(2.0, [5, 6, 7], [8])
    old.left([late], pending_since=early.t_arrival)  # held: `early` still runs
    new = record_to(loop, tmp_path / "." / "t.jsonl", 4, "fp")  # the same file, spelt another way
    assert new is not None and loop.recorder is new and not old.recording
    new.left([early], pending_since=None)
    new.close()
    assert b"\0" not in path.read_bytes()
    assert [line["input_length"] for line in lines(path)] == [3]  # the new recording alone
    other = tmp_path / "other.jsonl"  # another file: the recording under way writes on until the switch
    held = record_to(loop, path, 4, "fp")
    assert held is not None
    held.left([late], pending_since=early.t_arrival)
    assert record_to(loop, other, 4, "fp") is loop.recorder and not held.recording
    assert [line["input_length"] for line in lines(path)] == [3]  # its held line, written as it closed
