"""A page hands each chart its first figure in a script element, written as the chart
endpoints write it: a string in the figure cannot end the element, and a non-finite float
is null (the page's JSON.parse refuses NaN)."""

from __future__ import annotations

import json
import math
import re

from django.utils.html import json_script

from apps.dashboard.views.common import figure_script

FIGURE = {
    "data": [{"y": ["r0 · </script><script>alert(1)</script>", "a & b <!--"],
              "z": [[1.5, None, math.nan, math.inf]]}],
    "layout": {"title": {"text": "÷ median"}},
}  # fmt: skip


def script_text(html: str) -> str:
    found = re.fullmatch(r'<script id="figure-x" type="application/json">(.*)</script>', html, re.S)
    assert found, html
    return found.group(1)


def test_it_cannot_be_ended_by_a_string_in_the_figure():
    text = script_text(figure_script(FIGURE, "figure-x"))
    assert "<" not in text and ">" not in text and "&" not in text
    parsed = json.loads(text)
    assert parsed["data"][0]["y"] == FIGURE["data"][0]["y"]
    assert parsed["layout"] == FIGURE["layout"]


def test_it_writes_a_non_finite_float_as_null():
    parsed = json.loads(script_text(figure_script(FIGURE, "figure-x")))
    assert parsed["data"][0]["z"] == [[1.5, None, None, None]]


def test_it_parses_to_what_json_script_gave_for_a_finite_figure():
    finite = {**FIGURE, "data": [{**FIGURE["data"][0], "z": [[1.5, None, 2.0]]}]}
    ours = json.loads(script_text(figure_script(finite, "figure-x")))
    django = json.loads(script_text(json_script(finite, "figure-x")))
    assert ours == django
