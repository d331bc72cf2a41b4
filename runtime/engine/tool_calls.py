"""Tools in the engine: the grammar a request's tool_choice implies, and its result's calls parsed out.

- `request_grammar`: "required" and a named tool_choice run under the JSON schema of the calls
  (runtime.tools.schema.tool_call_schema) in the generic and native formats, or under a Lark grammar of the
  format's own syntax (`format_tool_grammar`: `<tool_call>` tags each around one call's JSON in the Hermes format,
  Cohere's `Action: ```json [...]``` ` or `<|START_ACTION|>[...]<|END_ACTION|>` in Command-R's), every object with
  `properties` closed to other keys unless it says `additionalProperties`; "auto" with a constraint
  (`response_format` json_object or json_schema, a regex, an EBNF grammar) runs under one grammar of both (a call,
  or an answer in that constraint: `auto_answer_grammar`); otherwise "auto" and "none" run under the request's own
  grammar, if any.
- `with_tool_calls`: the result of a request whose tool_choice is not "none", with its calls parsed from its text
  (runtime.tools.parse, in the template's format), `text` the content outside the calls ("" when there is none:
  OpenAI's `content: null`; always under "required" and a named function, whose grammar allows calls alone),
  finish_reason "tool_calls" when there are calls and generation ended by itself ("length" stays). The exact text
  the model wrote is remembered by call ids (the engine's `ToolCallMemory`), so a history that replays the calls
  renders those very tokens and the next turn hits the cache.
- Call ids are `call_` and 24 hex digits (or as many letters and digits as the template demands of ids: Mistral's
  9), drawn per request from one random seed (runtime.tools.use.CallIds), so a stream's deltas and the result name
  the same calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixcache.runtime.grammar import GrammarSpec
from radixcache.runtime.grammar.compiler import closed_objects, schema_object
from radixcache.runtime.grammar.json_patterns import quote_safe_patterns
from radixcache.runtime.grammar.nested import nested_rule
from radixcache.runtime.grammar.schema_check import check_schema
from radixcache.runtime.tools import ToolCallMemory, ToolCallParser, tool_call_schema
from radixcache.runtime.tools.features import TemplateFeatures
from radixcache.runtime.tools.schema import auto_answer_grammar, format_tool_grammar
from radixcache.runtime.tools.use import CallIds, ToolUse

if TYPE_CHECKING:
    from radixcache.runtime.engine.options import RequestOptions
    from radixcache.runtime.engine.request import GenerationResult


def request_grammar(
    options: RequestOptions, features: TemplateFeatures, special: frozenset[str] = frozenset()
) -> GrammarSpec | None:
    """The grammar a request runs under: its tool calls' schema when tool_choice requires a call (generic format),
    else its own `grammar` (None: unconstrained). `special`: the call syntax's markers the tokenizer has as special
    tokens (runtime.tools.call_tokens.special_markers), which the grammar lets the model write as those tokens. A
    tool's bad parameters schema raises GrammarError naming `tools[i].function.parameters...`."""
    use = options.tool_use
    if use is not None:  # whatever the choice, as the server checks them: a tool shown to the model is a valid one
        auto_with_answer = use.choice.mode == "auto" and options.grammar is not None
        _check_parameters(use, enforced=auto_with_answer or use.choice.mode in ("required", "function"))
    if use is not None and use.choice.mode == "auto" and options.grammar is not None:
        return _auto_with_answer(use, options.grammar, features, special)
    if use is None or use.choice.mode not in ("required", "function"):
        return options.grammar
    parallel = not use.one_call  # a named function: one call
    if features.format not in ("generic", "native"):  # Hermes tags, Cohere's actions: a grammar of their own
        grammar = format_tool_grammar(
            use.tools, use.choice, features.format, parallel_tool_calls=parallel, close=_library_form, special=special
        )
        if grammar is None:
            return options.grammar
        return GrammarSpec.assembled(grammar, path="tools")
    schema = tool_call_schema(use.tools, use.choice, parallel_tool_calls=parallel, features=features)
    if schema is None:
        return options.grammar
    # Arguments admit only the declared properties, whatever a tool's `strict` (a small model left free to add keys
    # writes them without end); `strict` decides whether a keyword the grammar cannot enforce is an error.
    strict = all(t.strict for t in use.tools)
    return GrammarSpec.json_schema(closed_objects(schema), strict=strict, path="tools")


def _auto_with_answer(
    use: ToolUse, answer: GrammarSpec, features: TemplateFeatures, special: frozenset[str]
) -> GrammarSpec:
    """tool_choice "auto" with a constrained answer: a call, or an answer in the constraint (one grammar with both).
    A JSON `response_format` is the answer's `%json` rule; a regex or EBNF grammar is nested whole (its mistakes
    named by its own field: runtime.grammar.nested)."""
    rule: dict[str, Any] | str
    if answer.kind == "json_object":
        rule = {"type": "object"}
    elif answer.kind == "json_schema":
        schema = schema_object(answer)
        schema = quote_safe_patterns(schema)
        rule = closed_objects(schema) if answer.strict else {"x-guidance": {"lenient": True}, **schema}
    else:
        rule = nested_rule(answer)
    grammar = auto_answer_grammar(
        use.tools,
        rule,
        parallel_tool_calls=use.parallel_tool_calls,
        features=features,
        close=_library_form,
        special=special,
    )
    if grammar is None:
        return answer
    return GrammarSpec.assembled(grammar, path="tools")


def _library_form(schema: Any) -> Any:
    """A tool's schema as its grammar's `%json` rule takes it (the compiler's own translation, for a schema compiled
    alone): its objects closed (strict), its patterns' negated classes quoted right (runtime.grammar.json_patterns)."""
    return closed_objects(quote_safe_patterns(schema))


def _check_parameters(use: ToolUse, enforced: bool) -> None:
    """GrammarError naming `tools[i].function.parameters...` for a tool's bad schema (`enforced`: its grammar is
    built, so its integers must be ones the grammar writes exactly: runtime.grammar.schema_check)."""
    for i, tool in enumerate(use.tools):
        check_schema(tool.parameters, f"tools[{i}].function.parameters", enforced=enforced)


def tool_parser(use: ToolUse, call_format: str, ids: CallIds) -> ToolCallParser:
    """The parser of one request's calls in `call_format` (the template's), its call ids drawn from `ids`: the
    engine's stream, its whole result and the server's choices build theirs here, so they parse alike."""
    return ToolCallParser(
        use.tools,
        call_format,
        new_id=ids.sequence(),
        max_calls=use.max_calls,
        calls_only=use.calls_only,
        forced=use.forced,
    )


def with_tool_calls(
    result: GenerationResult,
    use: ToolUse,
    features: TemplateFeatures,
    ids: CallIds,
    memory: ToolCallMemory,
    emitted_ids: Sequence[int] = (),
) -> GenerationResult:
    """`result` with its calls parsed (see the module docstring); unchanged when there are none. `emitted_ids`: the
    token ids of `result.text` as the model emitted them, remembered with the text (empty when not known)."""
    parser = tool_parser(use, features.format, ids)  # the stream's parser: streamed and whole results agree
    parser.feed(result.text)
    parser.finish()
    parsed = parser.result()
    if not parsed.tool_calls:  # its text is its content: all of it, or none under a grammar of calls alone
        return dataclasses.replace(result, text="") if use.calls_only else result
    known = emitted_ids if parsed.raw == result.text else ()
    if not parsed.dropped_calls:  # else the text holds calls the caller never saw: the next prompt renders its own
        memory.remember(parsed.tool_calls, parsed.raw, known, content=parsed.content or "")  # "": the reply had none
    return dataclasses.replace(
        result,
        text=parsed.content or "",
        tool_calls=parsed.tool_calls,
        finish_reason=parsed.finish_reason(result.finish_reason),
    )
