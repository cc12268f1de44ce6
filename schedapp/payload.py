"""What JSON a job may carry: its args, kwargs and message options, as PostgreSQL's jsonb and
Celery's JSON serializer both accept them.

Pure (no database, no broker). Bulk scheduling runs these checks on every job, so the common
flat payload is vetted in one loop and encoded once with the C encoder; anything else goes
through ``json_problem``, which alone writes the messages.
"""

from __future__ import annotations

import json
import json.encoder
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

# Control characters: NUL cannot be stored, and no broker wants the others in a name.
CONTROL_CHARS = re.compile(r"[\x00-\x1f]")
# A lone surrogate: Python holds it, UTF-8 (hence PostgreSQL) cannot encode it.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False)`` for a validated payload, several times faster:
    the C encoder built once, not per call (a validated payload has no cycles, no NaN and
    nothing but JSON types, so no check is lost)."""
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
    if make is None:  # no C accelerator: the standard encoder
        return json.JSONEncoder(ensure_ascii=False, check_circular=False).encode
    encode = make(None, None, json.encoder.encode_basestring, None, ": ", ", ", False, False, True)
    return lambda value: "".join(encode(value, 0))


encode_json = _json_encoder()


def type_name(value: Any) -> str:
    """The name of ``value``'s type, as the messages say what was given instead."""
    return type(value).__name__


def json_problem(value: Any, path: str, depth: int, max_depth: int) -> str | None:
    """Why ``value`` is not plain JSON (None if it is); paths name the offending element.

    Containers vet their plain scalar items inline (the common case, and the per-job cost
    of bulk scheduling); anything else goes through the full rules below, which alone
    write the messages."""
    if depth > max_depth:
        return f"{path} is nested deeper than {max_depth} levels."
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str) and "\x00" in value:
            return f"{path} contains a NUL character, which PostgreSQL's JSON cannot store."
        if isinstance(value, str) and LONE_SURROGATE.search(value):
            return f"{path} contains a lone surrogate, which is not valid Unicode."
        return None
    if isinstance(value, int):
        return None if abs(value) < 2**63 else f"{path} is an integer too large for JSON."
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value}, which JSON cannot carry."
    inline = depth < max_depth  # items sit one level deeper: vet them inline only if allowed
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if inline and _plain_scalar(item):
                continue
            problem = json_problem(item, f"{path}[{i}]", depth + 1, max_depth)
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has a non-string key {key!r}; JSON object keys are strings."
            if inline and _plain_scalar(key) and _plain_scalar(item):
                continue
            problem = json_problem(key, f"{path} key", depth + 1, max_depth) or json_problem(
                item, f"{path}[{key!r}]", depth + 1, max_depth
            )
            if problem:
                return problem
        return None
    return f"{path} is a {type_name(value)}, which is not JSON-serialisable."


def flat_plain(items: Iterable[Any]) -> bool:
    """True if every item is a JSON scalar the full rules accept: the common flat payload,
    vetted in one loop (False only means "ask ``json_problem``")."""
    for item in items:
        kind = type(item)
        if kind is int:
            if -(2**63) < item < 2**63:
                continue
        elif kind is str:
            if "\x00" not in item and (item.isascii() or not LONE_SURROGATE.search(item)):
                continue
        elif kind is float:
            if math.isfinite(item):
                continue
        elif item is None or kind is bool:
            continue
        return False
    return True


def _plain_scalar(value: Any) -> bool:
    """A JSON scalar the full rules would accept (a shortcut: False sends it through them)."""
    kind = type(value)
    if kind is str:
        return "\x00" not in value and not LONE_SURROGATE.search(value)
    if kind is int:
        return -(2**63) < value < 2**63
    if kind is float:
        return math.isfinite(value)
    return value is None or kind is bool


def plain(value: Any) -> Any:
    """A copy of a validated JSON value, lists for tuples: what is stored is not the caller's
    to change afterwards."""
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
