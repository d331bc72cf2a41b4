"""The one exception the grammar package raises for a bad request."""

from __future__ import annotations


class GrammarError(ValueError):
    """An invalid schema, regex or grammar. `path` names where (e.g.
    `response_format.json_schema.schema.properties.age.type`); the server turns it into a 400."""

    def __init__(self, message: str, path: str = "response_format") -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.reason = message

    def __reduce__(self) -> tuple[type[GrammarError], tuple[str, str]]:
        # Rebuilt from its parts (Ray sends a replica's errors pickled): from its message, the path came twice.
        return type(self), (self.reason, self.path)
