"""The one error of tool and message validation: it names where the problem is (`messages[3].tool_calls[0].id`,
`tools[1].function.name`), so the server can answer 400 with it."""

from __future__ import annotations


class ToolInputError(ValueError):
    """A message, a tool definition or a tool_choice the runtime cannot accept; `path` names the field."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
