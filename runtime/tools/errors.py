"""The one error of tool and message validation: it names where the problem is (`messages[3].tool_calls[0].id`,
`tools[1].function.name`), so the server can answer 400 with it."""

from __future__ import annotations


class ToolInputError(ValueError):
    """A message, a tool definition or a tool_choice the runtime cannot accept; `path` names the field."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

    def __reduce__(self) -> tuple[type[ToolInputError], tuple[str, str]]:
        # Rebuilt from its parts (Ray sends a replica's errors pickled): from its message alone it could not be.
        return type(self), (self.path, self.problem)
