"""The periodic passes' memory helpers: the collector paused for a block, and back after."""

from __future__ import annotations

import gc

import pytest

from apps.core.heap import gc_paused


def test_the_collector_is_off_inside_and_back_on_after_even_on_error():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the inner block leaves it off for the outer
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a failed pass")
    assert gc.isenabled()


def test_a_block_leaves_a_collector_turned_off_elsewhere_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
