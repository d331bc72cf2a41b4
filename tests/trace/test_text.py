"""Text traces (ShareGPT, conversation JSONL, OpenAI messages) parse into plain Conversation records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixcache.trace import Conversation, TraceError, Turn, iter_conversations, read_trace, write_conversations

SAMPLE = Path(__file__).resolve().parents[2] / "radixcache" / "data" / "sample_chat.jsonl"


def test_sharegpt_json_array_and_jsonl_give_the_same_conversations(tmp_path: Path) -> None:
    records = [
        {
            "id": "a",
            "conversations": [
                {"from": "system", "value": "S"},
                {"from": "human", "value": "hi"},
                {"from": "gpt", "value": "hello"},
                {"from": "human", "value": "bye"},
            ],
        },
        {"id": 7, "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
    ]
    (tmp_path / "s.json").write_text(json.dumps(records, indent=2))
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    expected = [
        Conversation("a", (Turn("hi", "hello"), Turn("bye")), "S"),
        Conversation("7", (Turn("q", "a"),)),
    ]
    for name in ("s.json", "s.jsonl"):
        trace = read_trace(tmp_path / name)
        assert (trace.format, trace.records) == ("sharegpt", expected)


def test_sharegpt_array_on_one_line_gives_each_conversation_its_own_id(tmp_path: Path) -> None:
    """A minified ShareGPT array (every record on line 1) without ids named every conversation `line-1`: the replay
    then counted one conversation, and `trace convert` wrote the same id three times."""
    records = [{"conversations": [{"from": "human", "value": text}]} for text in ("a", "b", "c")]
    records[1]["id"] = "mine"
    (tmp_path / "s.json").write_text(json.dumps(records))
    ids = [c.id for c in read_trace(tmp_path / "s.json").records]
    assert ids == ["conversation-1", "mine", "conversation-3"]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [c.id for c in read_trace(tmp_path / "s.jsonl").records] == ["line-1", "mine", "line-3"]


@pytest.mark.parametrize("fmt", [None, "sharegpt"])
def test_sharegpt_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path: Path, fmt: str | None) -> None:
    """The reader looked for a leading `[` by decoding the file's start as UTF-8 text: a bad byte there was a bare
    UnicodeDecodeError, naming neither the file nor the line (`error: 'utf-8' codec can't decode byte 0xff ...`)."""
    good = b'{"conversations": [{"from": "human", "value": "a"}]}'
    (tmp_path / "s.json").write_bytes(b"[\n" + good + b",\n" + good.replace(b'"a"', b'"\xff"') + b"]")
    with pytest.raises(TraceError, match=r"s\.json:3: not UTF-8 text"):
        read_trace(tmp_path / "s.json", fmt)
    (tmp_path / "b.jsonl").write_bytes(b"\x87\xa9timestamp")  # a msgpack stream, read as ShareGPT
    with pytest.raises(TraceError, match=r"b\.jsonl:1: not UTF-8 text"):
        read_trace(tmp_path / "b.jsonl", "sharegpt")


def test_a_lone_surrogate_is_refused_at_its_line_in_jsonl_and_in_an_array(tmp_path: Path) -> None:
    """Half an emoji ("\\ud83d") is not Unicode. JSONL said only `invalid JSON`; a ShareGPT array read it, and the
    replay then failed as a whole at the tokenizer, naming no file, line or conversation (and `trace convert`
    failed half-way through writing its output)."""
    message = '{"from": "human", "value": "hi \\ud83d there"}'
    (tmp_path / "s.json").write_text(f'[{{"conversations": [{{"from": "human", "value": "ok"}}, {message}]}}]')
    with pytest.raises(TraceError, match=r"s\.json:1: field 'conversations\[1\]\.value': holds a lone surrogate"):
        read_trace(tmp_path / "s.json")
    (tmp_path / "c.jsonl").write_text('{"turns": [{"user": "ok"}]}\n{"turns": [{"user": "hi \\ud83d"}]}\n')
    with pytest.raises(TraceError, match=r"c\.jsonl:2: invalid JSON \(a string holds a lone surrogate '\\ud83d'\)"):
        read_trace(tmp_path / "c.jsonl")


def test_sharegpt_array_errors_name_the_line_where_the_record_starts(tmp_path: Path) -> None:
    good = {"id": "a", "conversations": [{"from": "human", "value": "hi"}]}
    bad = {"id": "b", "conversations": [{"from": "robot", "value": "hi"}]}
    (tmp_path / "s.json").write_text(json.dumps([good, bad], indent=2))
    starts = [i + 1 for i, line in enumerate(json.dumps([good, bad], indent=2).splitlines()) if line == "  {"]
    start = starts[1]
    with pytest.raises(TraceError, match=rf"s\.json:{start}: field 'conversations\[0\]\.from': unknown speaker"):
        read_trace(tmp_path / "s.json")


def test_openai_messages_become_turns_with_the_last_awaiting_a_reply(tmp_path: Path) -> None:
    line = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ],
        "max_tokens": 9,
    }
    (tmp_path / "o.jsonl").write_text(json.dumps(line) + "\n")
    trace = read_trace(tmp_path / "o.jsonl")
    assert trace.format == "openai"
    assert trace.records == [Conversation("line-1", (Turn("ab", "c"), Turn("d", None, 9)), "S")]


def test_openai_out_of_order_roles_name_the_message(tmp_path: Path) -> None:
    line = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    (tmp_path / "o.jsonl").write_text("\n" + json.dumps(line) + "\n")
    with pytest.raises(TraceError, match=r"o\.jsonl:2: field 'messages\[1\]': user message where an assistant"):
        read_trace(tmp_path / "o.jsonl")


@pytest.mark.parametrize(
    ("content", "field", "problem"),
    [
        ([{"type": "image_url", "image_url": {"url": "x.png"}}], r"content\[0\]", "got 'image_url'"),
        ([{"type": "text", "text": "a"}, {"type": "input_audio"}], r"content\[1\]", "got 'input_audio'"),
        ([{"text": "a"}], r"content\[0\]", "got None"),
        (["a"], r"content\[0\]", "got 'str'"),
        ([{"type": "text"}], r"content\[0\]\.text", "expected a string, got NoneType"),
    ],
)
def test_openai_parts_other_than_text_are_refused_naming_the_part(
    tmp_path: Path, content: list, field: str, problem: str
) -> None:
    """An image (or audio) part was read as "" (an image-only message replayed as an empty one), where the server
    refuses it: the reader names the part, as the server does."""
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    line["messages"].append({"role": "user", "content": content})
    (tmp_path / "o.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(TraceError, match=rf"o\.jsonl:1: field 'messages\[2\]\.{field}': .*{problem}"):
        read_trace(tmp_path / "o.jsonl")


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"max_tokens": 2, "max_completion_tokens": 6}, "max_tokens", "max_tokens 2 and max_completion_tokens 6"),
        (
            {"messages": [{"role": "system", "content": []}, {"role": "user", "content": "a"}]},
            r"messages\[0\]\.content",
            "empty",
        ),
        ({"messages": [{"role": "user", "content": []}]}, r"messages\[0\]\.content", "empty list of parts"),
    ],
)
def test_openai_lines_the_server_refuses_are_refused_at_their_line(
    tmp_path: Path, change: dict, field: str, problem: str
) -> None:
    """Both limits with different values replayed max_tokens where the server used max_completion_tokens (and now
    answers 400); `content: []` replayed an empty turn the server refuses: each is named at its line."""
    line = {"messages": [{"role": "user", "content": "hi"}], **change}
    (tmp_path / "o.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(TraceError, match=rf"o\.jsonl:1: field '{field}': .*{problem}"):
        read_trace(tmp_path / "o.jsonl")


def test_openai_equal_limits_are_one_limit(tmp_path: Path) -> None:
    line = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "max_completion_tokens": 4}
    (tmp_path / "o.jsonl").write_text(json.dumps(line) + "\n")
    only_new = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4}
    (tmp_path / "n.jsonl").write_text(json.dumps(only_new) + "\n")
    expected = [Conversation("line-1", (Turn("hi", None, 4),), None)]
    assert read_trace(tmp_path / "o.jsonl").records == read_trace(tmp_path / "n.jsonl").records == expected


def test_the_shipped_sample_chat_trace_reads_as_conversations() -> None:
    trace = read_trace(SAMPLE)
    assert trace.format == "conversations"
    assert len(trace.records) == 8
    assert sum(len(c.turns) for c in trace.records) == 28


def test_conversation_turn_errors_name_the_turn_field(tmp_path: Path) -> None:
    (tmp_path / "c.jsonl").write_text('{"id": "x", "turns": [{"user": "a"}, {"user": "b", "max_tokens": 0}]}\n')
    with pytest.raises(TraceError, match=r"c\.jsonl:1: field 'turns\[1\]\.max_tokens': expected a positive"):
        list(iter_conversations(tmp_path / "c.jsonl"))


texts = st.text(max_size=10)
turns = st.builds(Turn, texts, st.none() | texts, st.none() | st.integers(1, 10**6))
conversations = st.builds(Conversation, texts, st.lists(turns, min_size=1, max_size=4).map(tuple), st.none() | texts)


@given(st.lists(conversations, max_size=5))
def test_conversation_jsonl_round_trips(tmp_path_factory: pytest.TempPathFactory, convs: list) -> None:
    path = tmp_path_factory.mktemp("c") / "c.jsonl"
    write_conversations(path, convs)
    assert list(iter_conversations(path)) == convs
