"""Tests marked with an xdist group run on one worker under `--dist loadgroup` (what .ci/run uses).

pytest-xdist groups a test by tagging its node id with `@group` on the worker; a pytest that stops honouring that
tag (9.2 did, with pytest-xdist 3.8) splits every group silently, and two Ray clusters or two copies of a
module's SmolLM2 fixture then run at once on the machine's two cores. This test fails instead.
"""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("probe")
def test_a_grouped_test_carries_its_group_in_its_node_id_under_loadgroup(request: pytest.FixtureRequest) -> None:
    config = request.config
    if not hasattr(config, "workerinput") or not getattr(config.option, "loadgroup", False):
        pytest.skip("not a pytest-xdist worker under --dist loadgroup: nothing groups here")
    assert request.node.nodeid.endswith("@probe"), f"the group tag is missing: {request.node.nodeid}"
