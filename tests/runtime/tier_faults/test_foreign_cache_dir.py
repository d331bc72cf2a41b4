"""A cache directory holding only other models' pages (other fingerprints) says so at open: one warning on the
"radixcache.disk" logger naming how many other fingerprints it holds and that this model's pages are absent. Until
2026-12-07 nothing did: a user pointing a new model (or a new --quant, page size, dtype) at an old --cache-dir saw
0 disk hits and no reason."""

from __future__ import annotations

import pytest

from tests.runtime.conftest import FP, disk_warnings, h, write


def test_a_directory_of_other_fingerprints_only_warns_once_at_open(open_store, caplog) -> None:
    write(open_store(fingerprint=FP + "/a"), 0, 1)
    write(open_store(fingerprint=FP + "/b"), 2)
    caplog.clear()
    with caplog.at_level("WARNING", logger="radixcache.disk"):
        store = open_store()
        assert store.enabled and store.count_prefix([bytes(16)]) == 0
    (record,) = disk_warnings(caplog)
    message = record.getMessage()
    assert "2 other model fingerprint(s)" in message and f"none of this model's ({FP})" in message
    assert FP + "/a" in message and FP + "/b" in message


@pytest.mark.parametrize("others", [False, True])
def test_a_directory_holding_this_model_s_pages_is_silent(open_store, caplog, others: bool) -> None:
    write(open_store(), 0)
    if others:
        write(open_store(fingerprint=FP + "/a"), 1)
    caplog.clear()
    with caplog.at_level("WARNING", logger="radixcache.disk"):
        assert open_store().count_prefix([h(0)]) == 1
    assert disk_warnings(caplog) == []


def test_an_empty_directory_is_silent(open_store, caplog) -> None:
    with caplog.at_level("WARNING", logger="radixcache.disk"):
        open_store()
    assert disk_warnings(caplog) == []
