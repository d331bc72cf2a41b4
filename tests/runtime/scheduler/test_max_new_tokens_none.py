"""`max_new_tokens=None` means "not given" everywhere: generate, chat, submit and fork took it (64, or the options'
own), but a session's defaults and turns and submit_group's `each` entries refused it, and `each=None` was a
ValueError where users mean "no per-prompt overrides"."""

from __future__ import annotations

from radixcache.runtime import Engine, RequestOptions
from radixcache.runtime.testing import RandomModel

from .conftest import assert_clean


def test_a_sessions_max_new_tokens_none_is_the_default_and_a_turns_keeps_the_sessions(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    turn = [{"role": "user", "content": "hi"}]
    default = engine.chat(turn, None, ignore_eos=True)
    assert len(default.token_ids) == 64
    assert engine.session(max_new_tokens=None, ignore_eos=True).send("hi").token_ids == default.token_ids
    s = engine.session(max_new_tokens=5, ignore_eos=True)
    assert len(s.send("hi", max_new_tokens=None).token_ids) == 5  # the session's own
    assert [len(r.token_ids) for r in s.fork(2, max_new_tokens=None, temperature=1.0, seed=3)] == [5, 5]
    opts = RequestOptions.of(7, ignore_eos=True)
    assert len(engine.session(options=opts, max_new_tokens=None).send("hi").token_ids) == 7
    assert_clean(engine)


def test_submit_groups_each_takes_max_new_tokens_none_and_none_for_no_overrides(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    prompts = [[5, 6, 7, 8, 9], [5, 6, 7, 8, 10]]
    want = [h.result() for h in engine.submit_group(prompts, 3, ignore_eos=True)]
    each = [{"max_new_tokens": None}, {"max_new_tokens": 2}]
    got = [h.result() for h in engine.submit_group(prompts, 3, ignore_eos=True, each=each)]
    assert [r.token_ids for r in got] == [want[0].token_ids, want[1].token_ids[:2]]
    none = [h.result() for h in engine.submit_group(prompts, 3, ignore_eos=True, each=None)]
    assert [r.token_ids for r in none] == [r.token_ids for r in want]
    assert_clean(engine)
