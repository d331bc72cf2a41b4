"""A grammar that admits no text (a schema that is only a reference to itself, a `$ref` cycle, a regex no text
matches) compiled, was queued, and failed at its first decode step, after its
prompt was prefilled, on the engine's loop. Its first mask is now computed when it is compiled: `submit` raises the
GrammarError before anything is queued, and a grammar that does admit text is served as before."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarError, GrammarSpec

ROOT = "response_format.json_schema.schema"
NO_TEXT = "no text the model can write satisfies the grammar"


CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
SELF_ALL_OF = {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec.json_schema({"$ref": "#"}, path=ROOT),
        GrammarSpec.json_schema(CYCLE, path=ROOT),
        GrammarSpec.json_schema(SELF_ALL_OF, path=ROOT),
        GrammarSpec.regex("[^\\x00-\\U0010FFFF]"),
    ],
)
def test_a_grammar_that_admits_no_text_is_refused_before_it_is_queued(engine: Engine, spec: GrammarSpec) -> None:
    with pytest.raises(GrammarError) as info:
        engine.submit("Say a", 8, grammar=spec, seed=1)  # raised here, not by the handle's result
    assert info.value.path == spec.path and NO_TEXT in str(info.value), info.value
    gauges = engine.check()
    assert gauges["running"] == 0 and gauges["waiting"] == 0 and gauges["locked_blocks"] == 0, gauges


def test_a_recursive_schema_that_admits_text_is_served(engine: Engine) -> None:
    nullable = {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}
    tree = {"type": "object", "properties": {"c": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}}
    for seed in range(3):
        r = engine.generate("x", 80, grammar=GrammarSpec.json_schema(nullable), temperature=1.0, seed=seed)
        assert (r.finish_reason, json.loads(r.text)) == ("stop", None)  # jsonschema recurses without end on it
        r = engine.generate("x", 80, grammar=GrammarSpec.json_schema(tree), temperature=1.0, seed=seed)
        if r.finish_reason == "stop":
            jsonschema.validate(json.loads(r.text), tree)
        else:
            assert r.finish_reason == "length"
