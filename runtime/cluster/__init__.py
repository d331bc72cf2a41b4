"""Engine replicas on Ray behind a cache-aware router: `replica` (one Engine in a Ray actor, publishing its cache
events) and `cluster` (the front door: it routes each request by radixcache.router and keeps the index by events)."""
