"""Admission policies: how many of a finished request's pages the tree adopts; the caller frees the rest.

Eviction decides which cached pages go when room is needed; admission decides which pages come in at all. A page
predicted dead (no later request will read it) costs the cache a slot until eviction finds it, and pushes out a
live page meanwhile: declining it at the door keeps that slot for pages that will be read. The two bounds in the
simulator show the difference: Belady where every page of a running request must be resident, and Belady with
admission, where a request's pages may skip the cache (radixcache.sim.oracle).

A policy sees an `AdmissionRequest` and returns how many pages, counted from the namespace root, to adopt. Pages
are only ever declined from the deep end (the tree is prefix-closed: a page is useless without those before it),
and never below what the request found cached. `retain="conversation"` is the caller's promise that the next turn
of a live conversation reads these pages: then every page is adopted, whatever the policy predicts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from radixcache.errors import PolicyError
from radixcache.policy.base import EvictionPolicy, check_parameter
from radixcache.policy.reuse import ReusePolicy

#: the values `retain` may take: None (no hint) or "conversation" (the next turn reads every page)
RETAIN_HINTS = (None, "conversation")


@dataclass(frozen=True)
class AdmissionRequest:
    """What an admission policy may look at for one request about to give its pages to the tree.

    `cached_pages`: pages of the request the tree already held when it was matched (its hit). `prompt_pages` and
    `total_pages`: whole pages of its prompt, and of everything it would adopt (prompt and output). `timestamp`:
    its arrival on the caller's clock (ms for traces), or None. `output_tokens`: how many tokens it generated.
    """

    namespace: Hashable
    cached_pages: int
    prompt_pages: int
    total_pages: int
    retain: str | None = None
    timestamp: float | None = None
    output_tokens: int | None = None  # tokens the request generated, when known


def check_retain(retain: str | None) -> str | None:
    """`retain` itself when it is a known hint; otherwise a PolicyError naming the allowed values."""
    if retain not in RETAIN_HINTS:
        raise PolicyError(f"retain must be None or 'conversation', got {retain!r}")
    return retain


class AdmissionPolicy(ABC):
    """Strategy object deciding how much of a request the tree adopts. Each cache or replay owns its instance."""

    name: str = "abstract"

    def admit(self, request: AdmissionRequest) -> int:
        """Pages to adopt, counted from the root: between `cached_pages` and `total_pages`, and all of them when
        the caller asked to retain the conversation."""
        if request.retain == "conversation" or request.total_pages <= request.cached_pages:
            return request.total_pages
        pages = self.decide(request)
        return max(request.cached_pages, min(request.total_pages, pages))

    @abstractmethod
    def decide(self, request: AdmissionRequest) -> int:
        """The policy's own answer; `admit` clamps it and applies the retain hint."""


class AdmitAll(AdmissionPolicy):
    """Adopt every page: the cache's behaviour without admission control."""

    name = "all"

    def decide(self, request: AdmissionRequest) -> int:
        return request.total_pages


class ReuseAdmission(AdmissionPolicy):
    """Decline a request's new pages when the `reuse` eviction policy has learned that their class is rarely read.

    The class is the one the new pages' leaf would take (radixcache.policy.reuse: the insert's size in log2 pages,
    whether it hung from the root, the output length's bucket, no hits yet). The request does not say whether its
    content returns (the policy's ghost keys, when it keeps them), so then both variants must qualify. Once a class
    has been watched for four times the waiting its prior stands for, pages whose class's reuse rate is under
    `threshold` times the mean are declined. One declined request in `explore` is admitted anyway, so that a class
    can show it has changed.
    """

    name = "reuse"

    def __init__(self, model: ReusePolicy, threshold: float = 0.003, explore: int = 8) -> None:
        check_parameter("reuse admission: threshold", threshold, 0)  # NaN passed `< 0`: every class was declined
        if type(explore) is not int or explore < 1:
            raise PolicyError(f"reuse admission: explore must be an int >= 1, got {explore!r}")
        self.model, self.threshold, self.explore = model, threshold, explore
        self.declined = 0  # requests whose new pages were declined

    def decide(self, request: AdmissionRequest) -> int:
        model = self.model
        mean = model.mean_rate()
        new = request.total_pages - request.cached_pages
        if mean <= 0.0:
            return request.total_pages
        for returning in (False, True) if model.ghosts > 0 else (False,):
            klass = model.class_of(
                new, root=request.cached_pages == 0, hits=0, output_tokens=request.output_tokens, returning=returning
            )
            if model.observed(klass) < 4 * model.prior_weight() or model.rate(klass) >= self.threshold * mean:
                return request.total_pages
        self.declined += 1
        if self.declined % self.explore == 0:
            return request.total_pages
        return request.cached_pages


ADMISSION_POLICIES: Mapping[str, type[AdmissionPolicy]] = MappingProxyType(
    {AdmitAll.name: AdmitAll, ReuseAdmission.name: ReuseAdmission}
)


def make_admission(policy: str | AdmissionPolicy | None, *, eviction: EvictionPolicy | None = None) -> AdmissionPolicy:
    """A fresh admission policy for a name in `ADMISSION_POLICIES` (None: "all"), or the given instance.

    "reuse" learns from the cache's `reuse` eviction policy (`eviction`, possibly wrapped: a `base` attribute is
    followed), so it needs one; a ReuseAdmission given as an object must be built on that same policy object."""
    if policy is None:
        return AdmitAll()
    model = eviction
    while model is not None and not isinstance(model, ReusePolicy):
        model = getattr(model, "base", None)
    if isinstance(policy, AdmissionPolicy):
        if isinstance(policy, ReuseAdmission) and eviction is not None and policy.model is not model:
            # Its model would hear no hit or eviction of this cache: a mean rate of 0, so it admitted everything.
            raise PolicyError(
                "a ReuseAdmission learns from the cache's own ReusePolicy: build it on the policy object the cache "
                "evicts with (ReuseAdmission(policy) for policy=policy), or pass admission 'reuse'"
            )
        return policy
    name = policy.lower() if isinstance(policy, str) else None
    if name == ReuseAdmission.name:
        if model is None:
            raise PolicyError("admission 'reuse' learns from the 'reuse' eviction policy: use it with policy 'reuse'")
        return ReuseAdmission(model)
    if name in ADMISSION_POLICIES:
        return ADMISSION_POLICIES[name]()
    raise PolicyError(f"unknown admission policy {policy!r}; choose one of {', '.join(sorted(ADMISSION_POLICIES))}")
