"""NativeLayers.run from engines on two threads sharing one model: the mirror a step read is still the plan's cached
one when its call returns (a helper late for that step may read it: runtime/native/team_pool.h), even where another
engine's step came between the first step's mirror tables and its call."""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any

import pytest

from tests.runtime.engine.test_native_layers import _decode_together, _gguf_model

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler"
)


def test_the_mirror_a_step_read_stays_cached_until_its_call_returned() -> None:
    model = _gguf_model(False)
    plan = model.native_layers
    assert plan is not None
    first: list[int] = []  # the thread whose first step is held between its tables and its call
    replaced = threading.Event()
    held: list[bool] = []
    tables, lib = plan._mirror_tables, plan._lib

    def mirror_tables(k: Any, v: Any) -> Any:
        out = tables(k, v)
        me = threading.get_ident()
        if not first:
            first.append(me)
        elif me != first[0]:
            replaced.set()
        return out

    class Checked:
        def __getattr__(self, name: str) -> Any:
            return getattr(lib, name)

        def native_decode_step(self, *args: Any) -> int:
            mine = plan._mirror
            if threading.get_ident() == first[0] and not held:
                replaced.wait(1)  # the other engine's step, where it may come in
            status = lib.native_decode_step(*args)
            if threading.get_ident() == first[0] and not held:
                held.append(plan._mirror is mine)
            return status

    plan._mirror_tables, plan._lib = mirror_tables, Checked()
    workers = [threading.Thread(target=_decode_together, args=(model, 2), kwargs={"threads": 2}) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert held == [True], "the plan let go of the mirror a step read before its call returned"
