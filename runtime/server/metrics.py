"""Prometheus text exposition of the engine's prefix-cache and scheduler state, and the server's latencies.

Counters and gauges are read from `engine.stats` at scrape time; TTFT and TPOT histograms are observed by the
server as each request finishes. No client library: the text format is a few lines.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
from collections import Counter
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from radixcache.runtime.tools.fair_lru import TenantNamespace, fair_scope

if TYPE_CHECKING:
    from radixcache.runtime.engine.protocol import GenerationEngine

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Bounded cardinality, fair to tenants: a tenant (an API key with its salts; keyless callers together) labels its
# unsalted namespace and at most MAX_TENANT_LABELS salted ones, MAX_NAMESPACE_LABELS in all; its later ones count
# under its own `other-<label of its key alone>` (`other-default` for keyless callers), so one key salting every
# request never takes the labels of the tenants after it, and each tenant's traffic counts under labels of its own.
MAX_NAMESPACE_LABELS = 256
MAX_TENANT_LABELS = 16


def namespace_label(namespace: Hashable) -> str:
    """A namespace's metrics label: "default" for keyless callers without a salt, else 12 hex digits of a hash.
    Never a key, a salt or a prompt (the namespace is itself a hash of key and salt: runtime.server.generation)."""
    if namespace is None:
        return "default"
    return hashlib.sha256(repr(namespace).encode()).hexdigest()[:12]


class Histogram:
    """A cumulative-bucket histogram (thread-safe)."""

    def __init__(self, name: str, help: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.buckets, value)] += 1
            self.sum += value

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            total = 0
            for bound, c in zip((*self.buckets, float("inf")), self.counts, strict=True):
                total += c
                le = "+Inf" if bound == float("inf") else repr(bound)
                out.append(f'{self.name}_bucket{{le="{le}"}} {total}')
            out += [f"{self.name}_sum {self.sum}", f"{self.name}_count {total}"]
        return out


class ServerMetrics:
    """What /metrics shows: engine state at scrape time plus request latencies and HTTP outcomes."""

    def __init__(self) -> None:
        self.ttft = Histogram("radixcache_time_to_first_token_seconds", "Request arrival to first token.", TTFT_BUCKETS)
        self.tpot = Histogram(
            "radixcache_time_per_output_token_seconds", "Mean time per token after the first.", TPOT_BUCKETS
        )
        self.requests_ok = 0
        self.requests_failed = 0
        self.by_status: Counter[int] = Counter()  # HTTP errors by status (429, 503, ...)
        self.cancelled = lambda: 0  # the server wires this to its Inflight's count
        self._lock = threading.Lock()
        self._namespaces: dict[str, list[int]] = {}  # label -> [requests, prompt tokens, cached tokens]
        self._labelled: Counter[Hashable] = Counter()  # tenant -> its salted namespaces with a label of their own

    def failed(self, status: int) -> None:
        with self._lock:
            self.requests_failed += 1
            self.by_status[status] += 1

    def observe(self, result: Any, namespace: Hashable = None) -> None:
        """A finished engine request: its latencies, and its namespace's prompt and cached tokens."""
        self.ttft.observe(result.ttft_s)
        if len(result.token_ids) > 1:
            self.tpot.observe(result.tpot_s)
        with self._lock:
            row = self._namespaces.setdefault(self._label(namespace), [0, 0, 0])
            row[0] += 1
            row[1] += result.prompt_tokens
            row[2] += result.cached_tokens

    def _label(self, namespace: Hashable) -> str:
        """`namespace`'s label, its own while its tenant's and all tenants' budgets last (MAX_TENANT_LABELS,
        MAX_NAMESPACE_LABELS), else its tenant's overflow; a tenant's unsalted namespace (`default` for keyless
        callers, a key's alone) always has its own: one a configured tenant, bounded by the keys. Under the lock."""
        label, tenant = namespace_label(namespace), fair_scope(namespace)
        if (
            label in self._namespaces
            or namespace is None
            or (isinstance(namespace, TenantNamespace) and namespace == tenant)
        ):
            return label  # counted already, or the namespace of keyless callers or of a key alone (no salt)
        own = sum(self._labelled.values())  # the salted namespaces labelled as their own
        if self._labelled[tenant] < MAX_TENANT_LABELS and own < MAX_NAMESPACE_LABELS:
            self._labelled[tenant] += 1
            return label
        # a tenant's overflow; a namespace not naming its tenant (not the server's) has none of its own
        return f"other-{namespace_label(tenant)}" if isinstance(namespace, TenantNamespace) else "other"

    def _namespace_lines(self) -> list[str]:
        out = []
        with self._lock:
            rows = sorted(self._namespaces.items())
            statuses = sorted(self.by_status.items())
        for i, (name, help) in enumerate(
            (
                ("radixcache_namespace_requests_total", "Engine requests per cache namespace (hashed label)."),
                ("radixcache_namespace_prompt_tokens_total", "Prompt tokens per cache namespace (hashed label)."),
                (
                    "radixcache_namespace_cached_tokens_total",
                    "Cached prompt tokens per cache namespace (hashed label).",
                ),
            )
        ):
            out += [f"# HELP {name} {help}", f"# TYPE {name} counter"]
            out += [f'{name}{{namespace="{label}"}} {row[i]}' for label, row in rows]
        name = "radixcache_http_errors_total"
        out += [f"# HELP {name} HTTP errors by status.", f"# TYPE {name} counter"]
        out += [f'{name}{{status="{status}"}} {count}' for status, count in statuses]
        return out

    @staticmethod
    def _tier_lines(tiers: Any, model_name: str) -> list[str]:
        """Per-tier hits and page moves (engine.stats.tiers), labelled by tier; nothing without tiers."""
        if tiers is None:
            return []
        hits = "radixcache_tier_hit_tokens_total"
        loaded = "radixcache_tier_loaded_pages_total"
        out = [f"# HELP {hits} Prompt tokens of fresh requests served from each tier.", f"# TYPE {hits} counter"]
        for tier in ("device", "host", "disk"):
            out.append(f'{hits}{{model="{model_name}",tier="{tier}"}} {getattr(tiers, f"{tier}_hit_tokens")}')
        out += [f"# HELP {loaded} Pages copied back up into the KV pool.", f"# TYPE {loaded} counter"]
        for tier in ("host", "disk"):
            out.append(f'{loaded}{{model="{model_name}",tier="{tier}"}} {getattr(tiers, f"{tier}_loaded_pages")}')
        for name, help, value in (
            (
                "radixcache_tier_declined_pages_total",
                "Pages found below the pool but recomputed (cheaper).",
                tiers.declined_pages,
            ),
            ("radixcache_tier_host_saved_pages_total", "Pages copied to the host tier.", tiers.host_saved_pages),
            (
                "radixcache_tier_host_failed_copies_total",
                "Copies to or from the host tier that raised (not cached there, or recomputed).",
                tiers.host_failed_copies,
            ),
            ("radixcache_tier_disk_queued_pages_total", "Pages queued for the disk tier.", tiers.disk_queued_pages),
            (
                "radixcache_tier_disk_dropped_pages_total",
                "Disk writes dropped (queue full, tier off, or a failed write).",
                tiers.disk_dropped_pages,
            ),
            (
                "radixcache_tier_disk_failed_reads_total",
                "Disk reads that failed (one per read, at a page failing its checks: it and the rest recomputed).",
                tiers.disk_failed_reads,
            ),
        ):
            out += [f"# HELP {name} {help}", f"# TYPE {name} counter", f'{name}{{model="{model_name}"}} {value}']
        return out

    def render(self, engine: GenerationEngine, model_name: str) -> str:
        s = engine.stats
        model_name = label_value(model_name)  # the served name is the user's: a quote in it would end the label
        label = f'{{model="{model_name}"}}'
        rows: list[tuple[str, str, str, float]] = [
            (
                "radixcache_prefix_cache_queries_tokens_total",
                "counter",
                "Prompt tokens looked up in the cache.",
                s.prompt_tokens,
            ),
            (
                "radixcache_prefix_cache_hits_tokens_total",
                "counter",
                "Prompt tokens served from the cache.",
                s.cached_tokens,
            ),
            ("radixcache_prefix_cache_hit_rate", "gauge", "Hits / queries, in tokens, since start.", s.hit_rate),
            ("radixcache_prefill_tokens_total", "counter", "Prompt tokens computed.", s.prefill_tokens),
            (
                "radixcache_recomputed_tokens_total",
                "counter",
                "Positions recomputed after preemption.",
                s.recomputed_tokens,
            ),
            ("radixcache_generation_tokens_total", "counter", "Tokens generated.", s.generated_tokens),
            ("radixcache_engine_requests_total", "counter", "Engine requests finished.", s.requests),
            ("radixcache_preemptions_total", "counter", "Requests preempted under memory pressure.", s.preemptions),
            (
                "radixcache_admission_declined_pages_total",
                "counter",
                "Computed KV pages the admission policy kept out of the cache (freed instead).",
                s.admission_declined_pages,
            ),
            ("radixcache_kv_blocks_capacity", "gauge", "KV pages in the pool.", s.capacity_blocks),
            ("radixcache_kv_blocks_free", "gauge", "KV pages free.", s.free_blocks),
            ("radixcache_kv_blocks_evictable", "gauge", "KV pages cached and evictable.", s.evictable_blocks),
            ("radixcache_kv_blocks_locked", "gauge", "KV pages locked by running requests or pins.", s.locked_blocks),
            ("radixcache_requests_running", "gauge", "Requests admitted (prefilling or decoding).", s.running),
            ("radixcache_requests_waiting", "gauge", "Requests queued.", s.waiting),
            (
                "radixcache_queue_waiting",
                "gauge",
                "Requests submitted and not yet admitted (what --max-queue bounds).",
                engine.queue.waiting,
            ),
            (
                "radixcache_engine_threads",
                "gauge",
                "Torch threads the engine's steps run on now (fewer while other programs take the cores).",
                s.threads,
            ),
            (
                "radixcache_engine_thread_changes_total",
                "counter",
                "Times the engine changed its thread count to the cores it gets.",
                s.thread_changes,
            ),
            ("radixcache_http_requests_ok_total", "counter", "HTTP generation requests answered.", self.requests_ok),
            (
                "radixcache_http_requests_failed_total",
                "counter",
                "HTTP requests refused or failed.",
                self.requests_failed,
            ),
            (
                "radixcache_requests_cancelled_total",
                "counter",
                "Engine requests aborted by the server (client gone, shutdown).",
                self.cancelled(),
            ),
        ]
        out: list[str] = []
        for name, kind, help, value in rows:
            out += [f"# HELP {name} {help}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        up = getattr(engine, "replica_up", None)  # replicas (runtime.cluster.front): each one's, as `stats` read them
        if up:
            name = "radixcache_replica_up"
            out += [f"# HELP {name} Whether the engine replica answered this scrape (0: dead, or alive and frozen)."]
            out += [f"# TYPE {name} gauge"]
            out += [f'{name}{{model="{model_name}",replica="{r}"}} {int(v)}' for r, v in sorted(up.items())]
        if s.disk_tier_up is not None:  # a cache directory: whether it still takes writes (summed over replicas)
            name = "radixcache_disk_tier_up"
            out += [f"# HELP {name} Whether the disk tier accepts writes (0: it turned itself off, a full disk, say)."]
            out += [f"# TYPE {name} gauge", f"{name}{label} {s.disk_tier_up}"]
        out += self._tier_lines(s.tiers, model_name)
        out += self.ttft.lines() + self.tpot.lines() + self._namespace_lines()
        return "\n".join(out) + "\n"


def label_value(text: str) -> str:
    """`text` as a Prometheus label value: backslash, double quote and line feed escaped (the exposition format's
    only escapes inside a label value)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
