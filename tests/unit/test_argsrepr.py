"""``argsrepr``/``kwargsrepr`` from the arguments' JSON text (``dispatch.json_saferepr``) are
what Celery's ``as_task_v2`` writes, ``saferepr(args or (), 1024, maxlevels)``, whichever of
its two paths (the builtin ``repr``, or ``saferepr`` itself) a text takes. The oracle is
Celery's own ``saferepr`` on the parsed value."""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery.utils.saferepr import saferepr
from hypothesis import given, settings
from hypothesis import strategies as st

from schedapp.dispatch import json_saferepr
from tests import examples

TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from("'\"\\\n[]{}")
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def celerys(value: Any, empty: Any, levels: int) -> str:
    return saferepr(value or empty, 1024, maxlevels=levels)


@settings(max_examples=examples(600))
@given(
    args=st.lists(VALUES, max_size=5),
    kwargs=st.dictionaries(TEXT, VALUES, max_size=5),
    ascii_only=st.booleans(),
    separators=st.sampled_from([(", ", ": "), (",", ":")]),  # PostgreSQL's, compact
    levels=st.sampled_from([3, 1, 0]),
)
def test_the_repr_of_the_json_text_is_celerys_saferepr(
    args, kwargs, ascii_only, separators, levels
):
    for value, empty in ((args, ()), (kwargs, {})):
        text = json.dumps(value, ensure_ascii=ascii_only, separators=separators)
        assert json_saferepr(text, empty, levels) == celerys(value, empty, levels)


@pytest.mark.parametrize(
    ("text", "empty", "expected"),
    [
        ("[]", (), "()"),  # apply_async's ``args or ()``
        ("{}", {}, "{}"),
        ('[1, "two", true, null, 1.5]', (), "[1, 'two', True, None, 1.5]"),
        ('{"label": "xé"}', {}, "{'label': 'xé'}"),
        ('["it\'s"]', (), "['it\\'s']"),  # saferepr's quoting, not repr's "it's"
        ('["a\\nb"]', (), "['a\nb']"),  # nor its escapes
        ("[[[[1]]]]", (), "[[[[...]]]]"),  # deeper than task_repr_maxlevels (3)
        (json.dumps(["x" * 2000]), (), saferepr(["x" * 2000], 1024)),  # cut at 1024
    ],
)
def test_argsrepr_table(text, empty, expected):
    assert json_saferepr(text, empty) == expected
