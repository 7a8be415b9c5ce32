"""`opsboard-agent run --info KEY=VALUE`: extra node_info fields (a rack, for the fleet
overview's blocks), bounded as the server bounds node_info's extras."""

import argparse

import pytest

from opsboard_agent.cli import _info_item


def test_an_info_item_is_a_key_and_its_value():
    assert _info_item("rack=r12") == ("rack", "r12")
    assert _info_item("row.name=a=b") == ("row.name", "a=b")


@pytest.mark.parametrize("text", ["rack", "=r1", "1rack=r", "gpus=9", "rack=" + "x" * 1025])
def test_a_bad_info_item_is_refused_with_the_rule(text):
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        _info_item(text)
