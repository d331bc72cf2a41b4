"""max_tokens=0 with logprobs asked, through the `openai` client: each choice's logprobs are those of no token (the
completions shape's four empty lists, chat's empty `content`), as a reply whose only token is a stop token has,
not null (a client reading `choice.logprobs.tokens` raised AttributeError on it). On the in-process tiny app."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine

EOS = 256  # the tiny checkpoint's <|im_end|>

pytestmark = pytest.mark.xdist_group("tiny_app")  # the shared in-process app (conftest.py)


@pytest.fixture(scope="module")
def client(tiny_app: tuple[TestClient, Engine]) -> openai.OpenAI:
    """The openai client over the in-process app (a TestClient is an httpx.Client)."""
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=tiny_app[0], max_retries=0)


def test_an_empty_completion_has_the_logprobs_of_no_token(client: openai.OpenAI) -> None:
    empty = client.completions.create(model="tiny", prompt="hello", max_tokens=0, n=2, logprobs=2)
    # the same shape a reply of one stop token has: its stop token's logprob is never shown
    stopped = client.completions.create(
        model="tiny", prompt="hello", max_tokens=1, logprobs=2, logit_bias={str(EOS): 100}
    )
    assert stopped.choices[0].text == "" and stopped.choices[0].finish_reason == "stop"
    reference = stopped.choices[0].logprobs
    assert reference is not None and reference.tokens == []
    assert [c.index for c in empty.choices] == [0, 1]
    for choice in empty.choices:
        assert choice.logprobs == reference
        assert (choice.text, choice.finish_reason) == ("", "length")
    unasked = client.completions.create(model="tiny", prompt="hello", max_tokens=0)
    assert unasked.choices[0].logprobs is None


def test_an_empty_chat_completion_has_the_logprobs_of_no_token(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hello"}]
    empty = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=0, logprobs=True)
    stopped = client.chat.completions.create(
        model="tiny", messages=messages, max_completion_tokens=1, logprobs=True, logit_bias={str(EOS): 100}
    )
    assert stopped.choices[0].finish_reason == "stop"
    reference = stopped.choices[0].logprobs
    assert reference is not None and reference.content == []
    assert empty.choices[0].logprobs == reference
    unasked = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=0)
    assert unasked.choices[0].logprobs is None
