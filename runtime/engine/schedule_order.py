"""The scheduler's admission order (`admission_order`: the starvation guard, priority, then fcfs, lpm or
dfs-weight), the `dfs-weight` order itself (waiting requests grouped by the cached subtree they hit, heaviest
subtree first, so that a shared prefix is computed once and then hit by the rest), and in-batch sharing's test
(`shares_uncommitted_pages`).

Pure ordering over what `KVManager.peek` found for each request (the deepest tree node its prompt reaches); it
changes nothing in the tree and reads only the nodes' parents and uids.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from radixcache import TreeNode
from radixcache.runtime.engine.request import Request
from radixcache.runtime.kv.manager import KVManager
from radixcache.tokens import as_token_array, common_prefix_length


def dfs_weight_order(reqs: list[Request], nodes: dict[int, TreeNode | None]) -> list[Request]:
    """Depth-first over the cached subtrees the requests hit (`nodes[rid]`: the deepest node reached, None for no
    hit), heaviest (most requests) child first; within a subtree, requests that hit deeper go before those whose
    hit ends higher up (they need fewer new pages). Priority comes first; requests that hit nothing come last."""
    weight: dict[int, int] = defaultdict(int)
    children: dict[int, dict[int, TreeNode]] = defaultdict(dict)
    at: dict[int, list[Request]] = defaultdict(list)
    tops: dict[int, TreeNode] = {}
    loose = []
    for r in reqs:
        node = nodes[r.rid]
        if node is None:
            loose.append(r)
            continue
        at[node.uid].append(r)
        while node is not None:
            weight[node.uid] += 1
            parent = node.parent
            if parent is None:
                tops[node.uid] = node
            else:
                children[parent.uid][node.uid] = node
            node = parent
    out: list[Request] = []

    def visit(node: TreeNode) -> None:  # the subtree's deeper hits before the requests that end here
        kids = sorted(children[node.uid].values(), key=lambda n: (-weight[n.uid], n.uid))
        for kid in kids:
            visit(kid)
        out.extend(sorted(at[node.uid], key=lambda r: r.rid))

    for top in sorted(tops.values(), key=lambda n: (-weight[n.uid], n.uid)):
        visit(top)
    out.extend(sorted(loose, key=lambda r: r.rid))
    out.sort(key=lambda r: -r.priority)  # stable: priority first, the DFS order within a priority
    return out


def must_wait_for_sharer(
    req: Request, cached: int, now: float, prefilling: list[Request], kv: KVManager, cfg: Any
) -> bool:
    """In-batch sharing: `req` waits while a request being prefilled computes a page it would compute too, and will
    commit it before leaving (all of them with in-flight sharing; without, only a pinned prompt reaches the tree
    before its request leaves). Never under fcfs, without the cache, or once `req` is starved."""
    if not cfg.in_batch_sharing or cfg.schedule == "fcfs" or not kv.enable_cache:
        return False
    if req.wait_steps >= cfg.max_wait_steps or now - req.t_arrival >= cfg.max_wait_s:
        return False
    sharers = prefilling if cfg.share_in_flight else [r for r in prefilling if r.pin]
    return shares_uncommitted_pages(req, cached, sharers, kv)


def shares_uncommitted_pages(req: Request, cached: int, prefilling: list[Request], kv: KVManager) -> bool:
    """In-batch sharing: a request being prefilled computes a page `req` would compute too (past `cached`, the
    tokens `req` found in the tree) and will commit it, within its admission limit."""
    p = kv.page_size
    mine = as_token_array(req.all_ids[: req.prefill_end - 1])
    for other in prefilling:
        if other.namespace != req.namespace:
            continue
        theirs = as_token_array(other.all_ids[: other.prefill_end])
        shared = common_prefix_length(theirs, mine, 0)
        floor = max(cached, other.kv.tree_blocks * p)
        # Pages past the other's admission limit never reach the tree: waiting for them would be in vain.
        if shared - shared % p > floor and kv.admission_limit(other.kv) * p > floor:
            return True
    return False


def admission_order(
    waiting: list[Request], prefilling: list[Request], kv: KVManager, cfg: Any, now: float
) -> tuple[dict[int, int], list[Request]]:
    """Waiting requests in admission order (the starved first, by arrival; then priority and the schedule's order),
    and the cached prefix length found for each (when probed). `cfg`: the SchedulerConfig (schedule, max_wait_steps,
    max_wait_s)."""
    starved: list[Request] = []
    rest: list[Request] = []
    for r in waiting:  # one pass: `rest` as "not in starved" was quadratic in the queue, at every step
        (starved if r.wait_steps >= cfg.max_wait_steps or now - r.t_arrival >= cfg.max_wait_s else rest).append(r)
    starved.sort(key=lambda r: r.rid)
    cached: dict[int, int] = {}
    if cfg.schedule == "fcfs" or (len(rest) <= 1 and not prefilling):
        rest.sort(key=lambda r: (-r.priority, r.rid))
        return cached, starved + rest
    nodes: dict[int, TreeNode | None] = {}
    for r in rest:
        cached[r.rid], nodes[r.rid] = kv.peek(r.all_ids[: r.prefill_end - 1], r.namespace)
    if cfg.schedule == "lpm":
        rest.sort(key=lambda r: (-r.priority, -cached[r.rid], r.rid))
    else:
        rest = dfs_weight_order(rest, nodes)
    return cached, starved + rest
