"""Tools and tool turns: OpenAI's `tools`, `tool_choice` and agent histories, rendered into a model's prompt and
parsed back out of its output.

    tools = normalize_tools(body["tools"]); choice = normalize_tool_choice(body.get("tool_choice"), tools)
    text = tokenizer.apply_chat_template(messages, tools=tools, tool_memory=memory)   # loading/tokenizer.py
    features = tool_template_features(tokenizer)  # its "tool_use" template's, where it has one
    schema = tool_call_schema(tools, choice, features=features)
    parser = ToolCallParser(tools, features.format)
    ... deltas = parser.feed(text_delta) ...; parser.finish(); result = parser.result()
    memory.remember(result.tool_calls, result.raw)

Modules: `errors` (ToolInputError, naming the field), `specs` (tools and tool_choice), `messages` (histories),
`features` (what a template knows), `render` (messages and variables for the template; the generic format),
`prompt` (a chat's prompt, rendered alike by the engine, the server and the cluster's front door),
`memory` (the text the model emitted, by call ids, and its token ids), `known_tokens` (prompt text that carries
those ids), `scan` and `parse` (calls out of output, streamed or whole; Cohere's formats: `parse_command_r`),
`call_tokens` (special tokens of a call syntax, kept in the text calls are parsed from), `schema` (the JSON schema a
tool_choice allows, and the grammars of formats with their own syntax), `use` (`ToolUse`: a request's tools,
tool_choice and parallel_tool_calls, as `RequestOptions.tool_use` carries them). Pure Python: no torch.
"""

from __future__ import annotations

from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.features import TemplateFeatures, template_features, tool_template_features
from radixcache.runtime.tools.memory import ToolCallMemory
from radixcache.runtime.tools.messages import ChatMessage, ToolCall, normalize_messages
from radixcache.runtime.tools.parse import ParsedOutput, ToolCallParser, assemble, new_call_id, parse_tool_calls
from radixcache.runtime.tools.render import generic_calls_text, generic_tools_prompt, template_messages
from radixcache.runtime.tools.schema import auto_tool_grammar, call_schema, tool_call_schema
from radixcache.runtime.tools.specs import ToolChoice, ToolSpec, normalize_tool_choice, normalize_tools
from radixcache.runtime.tools.use import ToolUse

__all__ = [
    "ChatMessage",
    "ParsedOutput",
    "TemplateFeatures",
    "ToolCall",
    "ToolCallMemory",
    "ToolCallParser",
    "ToolChoice",
    "ToolInputError",
    "ToolSpec",
    "ToolUse",
    "assemble",
    "auto_tool_grammar",
    "call_schema",
    "generic_calls_text",
    "generic_tools_prompt",
    "new_call_id",
    "normalize_messages",
    "normalize_tool_choice",
    "normalize_tools",
    "parse_tool_calls",
    "template_features",
    "template_messages",
    "tool_call_schema",
    "tool_template_features",
]
