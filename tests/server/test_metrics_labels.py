"""/metrics with a served model name holding the characters the Prometheus exposition format escapes inside a
label value (backslash, double quote, line feed): the name was written raw, so a quote ended the label early and a
line feed split a sample in two, and every scraper refused the whole page. Each sample line is read here by the
format's grammar, written independently of the server's code, and the label read back is the name."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

NAME = 'team "a"\\models\nv2'
LABEL_VALUE = r'"((?:[^"\\\n]|\\["\\n])*)"'
PAIR = rf"[a-zA-Z_][a-zA-Z0-9_]*={LABEL_VALUE}"
SAMPLE = re.compile(rf"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{{{PAIR}(?:,{PAIR})*\}})? [-+0-9.eEinfNa]+$")
MODEL_LABEL = re.compile(rf"model={LABEL_VALUE}")


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def test_metrics_escape_the_served_model_name_in_every_label() -> None:
    m = tiny_model(seed=4)
    engine = Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64)
    with engine, TestClient(create_app(engine, NAME)) as client:
        r = client.post("/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
        page = client.get("/metrics").text
    samples = [line for line in page.splitlines() if line and not line.startswith("#")]
    bad = [line for line in samples if not SAMPLE.match(line)]
    assert not bad, bad[:3]
    models = {_unescape(v) for line in samples for v in MODEL_LABEL.findall(line)}
    assert models == {NAME}
