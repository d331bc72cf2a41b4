"""The tokenizer: SmolLM2's built from GGUF metadata, chat templates, streaming detokenisation, pre-tokenisers."""

from __future__ import annotations

import itertools
import json

import pytest

from radixcache.runtime.loading.chat_template import ChatTemplateError, render_chat_template
from radixcache.runtime.loading.gguf_tokenizer import backend_from_gguf, pre_tokenizer_for
from radixcache.runtime.loading.tokenizer import Tokenizer

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
FRANCE_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)
FRANCE_IDS = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198,
    1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
]  # fmt: skip
TEXTS = [
    "Hello, world!",
    "  leading and   inner spaces\n\n\ttabs\r\nand CRLF  ",
    "naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, العربية",
    "emoji 🙂👍🏽 👨‍👩‍👧 flags 🇫🇷 and combining e\u0301",
    "def f(x):\n    return x ** 2  # 3.14159, 1e-5, 0xFF, 1,000,000",
    "<|im_start|>user\nhi<|im_end|>",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_decode_encode_round_trips(smollm2_tokenizer, text):
    assert smollm2_tokenizer.decode(smollm2_tokenizer.encode(text), skip_special_tokens=False) == text


def test_smollm2_splits_digits_one_per_token(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("2024 and 1234567")
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[:4] == ["2", "0", "2", "4"]
    assert [p for p in pieces if p.strip().isdigit()] == list("20241234567")
    assert all(len(p.strip()) <= 1 for p in pieces if any(c.isdigit() for c in p))


def test_smollm2_special_tokens_eos_and_no_bos(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.token_to_id("<|im_end|>") == 2 and tok.eos_token_ids == (2,)
    assert tok.token_to_id("<|im_start|>") == 1 and tok.token_to_id("<|endoftext|>") == 0
    assert tok.vocab_size == 49152 and tok.add_bos is False
    assert tok.encode("Hi")[0] != 1 and tok.encode("<|im_end|>") == [2]
    assert tok.decode(tok.encode("a<|im_end|>b")) == "ab"


def test_smollm2_bpe_matches_a_naive_merge_loop(smollm2_path, smollm2_tokenizer):
    from radixcache.runtime.loading.gguf import GGUFFile

    with GGUFFile(smollm2_path) as f:
        ranks = {tuple(m.split(" ")): r for r, m in enumerate(f.metadata["tokenizer.ggml.merges"])}
        vocab = {t: i for i, t in enumerate(f.metadata["tokenizer.ggml.tokens"])}

    def naive_bpe(word: str) -> list[int]:
        parts = list(word)
        while len(parts) > 1:
            rank, i = min((ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(itertools.pairwise(parts)))
            if rank == 1 << 30:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return [vocab[p] for p in parts]

    for word in ["Hello", " capital", " France", " tokenization", " antidisestablishmentarianism", " SmolLM"]:
        assert smollm2_tokenizer.encode(word) == naive_bpe(word.replace(" ", "Ġ")), word


def test_smollm2_chat_template_renders_chatml(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.apply_chat_template(FRANCE) == FRANCE_PROMPT
    assert tok.encode(tok.apply_chat_template(FRANCE)) == FRANCE_IDS
    no_prompt = tok.apply_chat_template(FRANCE, add_generation_prompt=False)
    assert no_prompt == FRANCE_PROMPT.removesuffix("<|im_start|>assistant\n")
    custom = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, *FRANCE])
    assert custom.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")


def test_streaming_detokenizer_never_splits_a_character(smollm2_tokenizer):
    tok = smollm2_tokenizer
    text = "Paris 🙂👍🏽 日本語 e\u0301 done<|im_end|>"
    ids = tok.encode(text)
    detok = tok.detokenizer(prompt_ids=tok.encode("<|im_start|>assistant\n"))
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == detok.text == tok.decode(ids) == "Paris 🙂👍🏽 日本語 e\u0301 done"
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas[:-1]  # an emoji spans several byte-level tokens: held back until complete


def test_streaming_detokenizer_flushes_a_truncated_character(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("ok 🙂")
    detok = tok.detokenizer()
    streamed = "".join(detok.add(i) for i in ids[:-1])
    assert streamed == "ok" or streamed == "ok "
    assert streamed + detok.flush() == tok.decode(ids[:-1])  # the incomplete character, as decode shows it


def test_chat_template_errors_are_clear(kit):
    tok = Tokenizer(backend_from_gguf(kit.tiny_tokenizer_metadata(typed=False)), eos_token_ids=(2,), name="tiny")
    with pytest.raises(ChatTemplateError, match="tiny has no chat template"):
        tok.apply_chat_template(FRANCE)
    assert tok.apply_chat_template(FRANCE, chat_template=kit.CHATML).endswith("<|im_start|>assistant\n")
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
    with pytest.raises(ChatTemplateError, match="first must be user"):
        tok.apply_chat_template([{"role": "system", "content": ""}], chat_template=strict)
    with pytest.raises(ChatTemplateError, match="failed"):  # the sandbox refuses attribute escapes
        render_chat_template("{{ ''.__class__.__mro__[1].__subclasses__() }}", FRANCE)
    with pytest.raises(ChatTemplateError, match="must be a dict"):
        tok.apply_chat_template(["hello"], chat_template=kit.CHATML)
    assert render_chat_template("{{ messages | tojson }}", [{"role": "u", "content": "é"}]) == (
        '[{"role": "u", "content": "é"}]'
    )


CAFE = [{"role": "user", "content": "café"}]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        # the compact form some models' templates write their tools in: refused with a TypeError before
        (
            "{{ messages[0] | tojson(separators=(',', ':')) }}",
            json.dumps(CAFE[0], separators=(",", ":"), ensure_ascii=False),
        ),
        # transformers' first argument is ensure_ascii, not indent
        ("{{ messages[0] | tojson(true) }}", json.dumps(CAFE[0], ensure_ascii=True)),
        (
            "{{ messages[0] | tojson(indent=2, sort_keys=true) }}",
            json.dumps(CAFE[0], indent=2, sort_keys=True, ensure_ascii=False),
        ),
    ],
)
def test_tojson_takes_transformers_arguments(template, expected):
    assert render_chat_template(template, CAFE) == expected


def test_a_template_with_generation_blocks_renders_their_bodies():
    """TRL writes `{% generation %}` into the templates of the models it fine-tunes (transformers' training-mask
    tag); such a model's every chat failed with "does not compile: Encountered unknown tag 'generation'"."""
    template = (
        "{% for m in messages %}{% set x = 'kept' %}<|{{ m.role }}|>"
        "{% if m.role == 'assistant' %}{% generation %}{% set x = 'lost' %}{{ m.content }}<|end|>{% endgeneration %}"
        "{% else %}{{ m.content }}<|end|>{% endif %}{{ x }}{% endfor %}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    # as transformers renders it: the block's body, its own `set` scoped to the block
    assert render_chat_template(template, messages) == "<|user|>hi<|end|>kept<|assistant|>yo<|end|>kept"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ messages[0]['content'] + 5 }}", "failed: TypeError: can only concatenate str"),
        ("{{ 1 / 0 }}", "failed: ZeroDivisionError"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "failed: RecursionError"),
        ("{{ range(10 ** 9) | list }}", "failed: OverflowError"),
        ("{{ 2 ** 14900 }}", "failed: ValueError: Exceeds the limit"),  # under the sandbox's bound on **
        ("{{ " + "1" * 5000 + " }}", "does not compile: ValueError"),  # a literal past int()'s digit limit
    ],
)
def test_a_template_that_raises_any_error_is_a_chat_template_error(template, message):
    """Only Jinja's own errors were wrapped: what a template's expressions raise escaped as TypeError and the like,
    which the replay CLI reported as an internal error and the Python API as an untyped failure."""
    with pytest.raises(ChatTemplateError, match=message):
        render_chat_template(template, FRANCE, model="tiny")


def test_gguf_tokenizer_marks_control_tokens_special(kit):
    tok = Tokenizer.from_gguf_metadata(kit.tiny_tokenizer_metadata(typed=False), name="tiny")
    assert tok.encode("hello<|im_end|>")[-1] == 2 and tok.eos_token_ids == (2,)
    assert tok.decode(tok.encode("<|im_start|>hello world")) == "hello world"
    assert tok.chat_template == kit.CHATML


@pytest.mark.parametrize(
    "pre,expected",
    [
        ("smollm", ["1", "2", "3", "4", "5", "Ġx"]),
        ("default", ["12345", "Ġx"]),
        ("qwen2", ["1", "2", "3", "4", "5", "Ġx"]),
        ("llama-bpe", ["123", "45", "Ġx"]),
    ],
)
def test_named_pre_tokenizers_split_numbers_like_llama_cpp(pre, expected):
    assert [p for p, _ in pre_tokenizer_for(pre).pre_tokenize_str("12345 x")] == expected


@pytest.mark.parametrize(("pre", "whole"), [("llama-bpe", True), ("llama3", True), ("qwen2", False), ("smollm", False)])
def test_llama3_vocabularies_take_a_word_that_is_a_token_whole(kit, pre, whole):
    """llama.cpp tokenises llama3 vocabularies with ignore_merges (a pre-tokenised word that is itself a token is
    that token, as tiktoken does; Llama 3's tokenizer.json says "ignore_merges": true), other names by the merges
    alone. "hello" is a token here that no merge makes: llama-bpe files encoded it as "hell" + "o"."""
    meta = kit.tiny_tokenizer_metadata(pre, typed=False)
    meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"], "hello"]
    meta["tokenizer.ggml.token_type"] = [*meta["tokenizer.ggml.token_type"], 1]
    tok = Tokenizer.from_gguf_metadata(meta, name="tiny")
    tokens = meta["tokenizer.ggml.tokens"]
    by_merges = [tokens.index("hell"), tokens.index("o")]
    assert tok.encode("hello") == ([len(tokens) - 1] if whole else by_merges)
    assert tok.decode(tok.encode("hello world")) == "hello world"


@pytest.mark.parametrize(
    ("pre", "add_bos", "bos"), [("llama-bpe", None, True), ("llama3", None, True), ("llama-bpe", False, False),
                                ("qwen2", None, False), ("smollm", None, False)]
)  # fmt: skip
def test_llama3_vocabularies_prepend_bos_unless_the_file_says_not(kit, pre, add_bos, bos):
    """llama.cpp prepends BOS for llama3 pre-tokenizer names when tokenizer.ggml.add_bos_token is absent (older
    Llama 3 files lack it); such files' prompts went to the model without the BOS it was trained with."""
    meta = kit.tiny_tokenizer_metadata(pre, typed=False)
    del meta["tokenizer.ggml.add_bos_token"]
    if add_bos is not None:
        meta["tokenizer.ggml.add_bos_token"] = add_bos
    tok = Tokenizer.from_gguf_metadata(meta, name="tiny")
    plain = tok.encode("hi", add_special_tokens=False)
    assert tok.encode("hi") == ([0, *plain] if bos else plain)


def test_unsupported_gguf_tokenizers_are_named(kit):
    with pytest.raises(NotImplementedError, match="'made-up'"):
        backend_from_gguf({**kit.tiny_tokenizer_metadata(typed=False), "tokenizer.ggml.pre": "made-up"})
    with pytest.raises(NotImplementedError, match="'llama'"):
        backend_from_gguf({**kit.tiny_tokenizer_metadata(typed=False), "tokenizer.ggml.model": "llama"})


def test_a_gguf_string_at_two_ids_encodes_to_the_last_and_both_decode_to_it(kit, tmp_path):
    """llama.cpp's vocabulary load sets token_to_id[text] = i in id order: a string at two ids encodes to the last.
    Both ids are the model's tokens and must decode to their text; the later one decoded to '' (and a repeated
    control token's earlier id was plain text to a grammar)."""
    from radixcache.runtime.grammar.vocab import build_vocab, token_table
    from radixcache.runtime.loading.gguf import GGUFFile

    tokens, types, _ = kit.tiny_vocab()
    tokens, types = [*tokens, "hell", "<|im_end|>"], [*types, 1, 3]
    meta = {**kit.tiny_tokenizer_metadata(), "tokenizer.ggml.tokens": (kit.T_ARR, kit.T_STR, tokens)}
    meta["tokenizer.ggml.token_type"] = (kit.T_ARR, kit.T_I32, types)
    kit.write_gguf(tmp_path / "dup.gguf", meta, [])
    with GGUFFile(str(tmp_path / "dup.gguf")) as f:
        tok = Tokenizer.from_gguf_metadata(f.metadata, name="dup")
    hell = [i for i, t in enumerate(tokens) if t == "hell"]
    end = [i for i, t in enumerate(tokens) if t == "<|im_end|>"]
    assert len(hell) == len(end) == 2 and tok.vocab_size == len(tokens)
    assert tok.encode("hello") == [hell[-1], tokens.index("o")] and tok.encode("<|im_end|>") == [end[-1]]
    for i in hell:
        assert tok.decode([i]) == "hell" and tok.token_bytes(i) == b"hell" and tok.id_to_token(i) == "hell"
        assert tok.decode([i, tokens.index("o")]) == "hello"
    for i in end:
        assert tok.decode([i], skip_special_tokens=False) == "<|im_end|>" and tok.decode([i]) == ""
    assert set(end) <= set(token_table(tok).special)
    assert build_vocab(tok).lib is not None
