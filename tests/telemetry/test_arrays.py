"""apps.telemetry.arrays.arrays_joined against Postgres's own array_send, joined by
string_agg as the spans read joins a node's many-point chunks."""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.telemetry.arrays import arrays_joined

pytestmark = [pytest.mark.django_db]

INT4 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
FLOAT8 = st.floats(allow_nan=False, allow_infinity=False)


def joined_by_postgres(arrays: list[list], kind: str) -> bytes:
    """string_agg(array_send(a), '') over `arrays` in their order, by Postgres."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT string_agg(array_send(a), ''::bytea ORDER BY i)"
            f" FROM unnest(%s::text[]) WITH ORDINALITY AS u(a_text, i),"
            f" LATERAL (SELECT u.a_text::{kind}[] AS a) x",
            [["{" + ",".join(map(repr, a)) + "}" for a in arrays]],
        )
        return bytes(cursor.fetchone()[0])


@settings(max_examples=40, deadline=None)
@given(
    ints=st.lists(st.lists(INT4, max_size=12), min_size=1, max_size=6),
    floats=st.lists(st.lists(FLOAT8, max_size=12), min_size=1, max_size=6),
)
def test_the_elements_of_arrays_postgres_sent_joined(ints, floats):
    for arrays, kind, dtype in ((ints, "int4", np.int64), (floats, "float8", np.float64)):
        counts = np.array([len(a) for a in arrays])
        got = arrays_joined(joined_by_postgres(arrays, kind), counts, kind)
        assert got.dtype == dtype
        assert got.tolist() == [x for a in arrays for x in a]


def test_counts_that_do_not_match_the_arrays_are_refused():
    sent = joined_by_postgres([[1.5, 2.5, 3.5], [], [7.0]], "float8")
    assert arrays_joined(sent, np.array([3, 0, 1]), "float8").tolist() == [1.5, 2.5, 3.5, 7.0]
    # the same bytes, other counts: a length that differs, or the same total split
    # otherwise (each array's header names its own count)
    for counts in ([3, 1], [4, 0, 0], [2, 0, 2], [3, 1, 0], [1, 0, 3]):
        with pytest.raises(ValueError, match="joined arrays"):
            arrays_joined(sent, np.array(counts), "float8")
    with pytest.raises(ValueError, match="joined arrays"):  # floats read as ints
        arrays_joined(sent, np.array([3, 0, 1]), "int4")
