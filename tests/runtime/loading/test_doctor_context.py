"""`radixcache doctor`'s decode against the model's context: a prompt and decode that pass max_position are refused
by name before anything is measured (the engine stops at the limit, so the rate came from fewer tokens than asked,
and a prompt one short of the limit reported 0.0 tok/s, "0.0 of the bound")."""

from __future__ import annotations

import dataclasses

import pytest

from radixcache.runtime.doctor import diagnose
from tests.runtime.loading.test_gguf_model import random_weights, tiny_config, write_tiny_gguf


@pytest.fixture(scope="module")
def short_context(kit, tmp_path_factory):
    cfg = dataclasses.replace(tiny_config(kit), max_position=40)
    path = tmp_path_factory.mktemp("doctor") / "ctx40.gguf"
    write_tiny_gguf(kit, path, cfg, random_weights(cfg))
    return path


def run(path, prompt: int, new: int):
    return diagnose(str(path), threads=1, kernels="fixed", prompt_tokens=prompt, new_tokens=new, bandwidth_mb=1)


@pytest.mark.parametrize(("prompt", "new"), [(39, 2), (30, 32), (8, 33)])
def test_a_decode_past_the_context_is_refused_by_name(short_context, prompt, new):
    message = f"prompt of {prompt} tokens and {new} new tokens pass the model's max_position 40"
    with pytest.raises(ValueError, match=message):
        run(short_context, prompt, new)


@pytest.mark.parametrize(("prompt", "new"), [(38, 2), (8, 32)])
def test_a_decode_that_ends_at_the_context_runs_every_token(short_context, prompt, new):
    report = run(short_context, prompt, new)
    assert report.decode["prompt_tokens"] == prompt and report.decode["new_tokens"] == new
    assert report.decode["decode_tps"] > 0
