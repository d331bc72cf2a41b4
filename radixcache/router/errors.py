"""The router's error: a `RadixCacheError`, so callers that catch the library's errors catch it too."""

from __future__ import annotations

from radixcache.errors import RadixCacheError


class RouterError(RadixCacheError):
    """A router call was given something it cannot use (no replica, a bad parameter, a request id twice)."""
