"""A GGUF chat template that uses a Jinja filter Jinja does not know (`{{ m.content | foo }}`): reading the
template's tool features compiled it outside their try, so Engine() raised jinja2's TemplateAssertionError at
construction and no plain prompt could be served. The engine now starts; a chat says the template does not compile."""

from __future__ import annotations

import os
import shutil

import pytest

from radixcache.runtime.engine.engine import Engine
from radixcache.runtime.loading.chat_template import ChatTemplateError
from radixcache.runtime.tools import template_features
from tests.runtime.loading.test_gguf_model import random_weights, tiny_config, write_tiny_gguf

needs_cc = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")

TEMPLATE = "{% for m in messages %}{{ m.content | foo }}{% endfor %}"


def test_features_of_a_template_with_an_unknown_filter_are_none():
    assert template_features(TEMPLATE).format == "generic"


@needs_cc
def test_an_engine_with_such_a_template_serves_plain_prompts_and_names_the_filter_on_chat(kit, tmp_path):
    cfg = tiny_config(kit)
    path = tmp_path / "model.gguf"
    write_tiny_gguf(kit, path, cfg, random_weights(cfg), meta_overrides={"tokenizer.chat_template": TEMPLATE})
    engine = Engine(str(path), kernels="fixed")
    try:
        assert len(engine.generate("hello", max_new_tokens=2, temperature=0.0).token_ids) == 2
        with pytest.raises(ChatTemplateError, match="the chat template does not compile: No filter named 'foo'"):
            engine.chat([{"role": "user", "content": "hi"}], max_new_tokens=2)
    finally:
        engine.close()
