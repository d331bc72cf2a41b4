"""An OpenAI-compatible HTTP server over the Engine: FastAPI app factory, request models, SSE, metrics."""

from __future__ import annotations

from radixcache.runtime.server.app import create_app

__all__ = ["create_app"]
