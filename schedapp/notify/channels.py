"""The channels a team's notifications go through (``SCHEDAPP_NOTIFICATIONS``), read and
checked, and the one routing rule: which channels want an event of a kind, for a job with
these tags, naming these channels. Pure: no database, no mail, no network."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

#: The event kinds a notification is about (issue 30): a breach, a job dead-lettered, and
#: the recovery that clears an incident.
KINDS = ("late", "overrunning", "missed_finish_by", "failing", "dead", "recovered")
RECOVERED = "recovered"
TYPES = ("email", "webhook")
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")

DEFAULT_GROUP_WAIT = timedelta(seconds=10)
DEFAULT_GROUP_INTERVAL = timedelta(seconds=60)
DEFAULT_TIMEOUT = 5.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF = timedelta(seconds=10)
DEFAULT_BACKOFF_MAX = timedelta(minutes=10)
MAX_TIMEOUT = 60.0  # a delivery holds its channel's lock while it waits: keep it short

_COMMON = {"type", "kinds", "tags", "group_wait", "group_interval", "max_attempts"}
_KEYS = {
    "email": _COMMON | {"to", "from", "backoff", "backoff_max"},
    "webhook": _COMMON | {"url", "secret", "timeout", "backoff", "backoff_max"},
}


@dataclass(frozen=True)
class Channel:
    """One named channel. ``tags`` None: every job's events; a set: only jobs carrying one
    of them (and jobs that name the channel in their ``notify`` field)."""

    name: str
    type: str
    kinds: frozenset[str] = frozenset(KINDS)
    tags: frozenset[str] | None = None
    group_wait: timedelta = DEFAULT_GROUP_WAIT
    group_interval: timedelta = DEFAULT_GROUP_INTERVAL
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: timedelta = DEFAULT_BACKOFF
    backoff_max: timedelta = DEFAULT_BACKOFF_MAX
    timeout: float = DEFAULT_TIMEOUT
    to: tuple[str, ...] = ()
    from_email: str | None = None  # None: Django's DEFAULT_FROM_EMAIL
    url: str = ""
    secret: str = ""

    def wants(self, kind: str, tags: Iterable[str], named: Iterable[str] = ()) -> bool:
        """Whether an event of ``kind`` about a job with ``tags``, naming the channels
        ``named``, goes to this channel: its kind is one the channel takes, and the job
        names the channel or carries one of its tags (any job, if it has no tag filter)."""
        if kind not in self.kinds:
            return False
        if self.name in set(named) or self.tags is None:
            return True
        return not self.tags.isdisjoint(tags)


def route(
    channels: Mapping[str, Channel], kind: str, tags: Iterable[str], named: Iterable[str] = ()
) -> list[str]:
    """The names of the channels that want this event, sorted."""
    tags, named = list(tags), list(named)
    return sorted(name for name, c in channels.items() if c.wants(kind, tags, named))


def read_channels(raw: Any) -> tuple[dict[str, Channel], list[str]]:
    """``SCHEDAPP_NOTIFICATIONS`` as channels, and the problems found, one line each naming
    the setting, the channel and the key. A channel with a problem is left out."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [
            f"SCHEDAPP_NOTIFICATIONS must be a mapping of channel name to options, "
            f"not {type(raw).__name__}."
        ]
    channels: dict[str, Channel] = {}
    problems: list[str] = []
    for name, options in raw.items():
        where = f"SCHEDAPP_NOTIFICATIONS[{name!r}]"
        found: list[str] = []
        channel = _read_one(name, options, where, found)
        problems.extend(found)
        if channel is not None and not found:
            channels[name] = channel
    return channels, problems


def _read_one(name: Any, options: Any, where: str, found: list[str]) -> Channel | None:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        found.append(
            f"{where}: a channel name is 1 to 64 lowercase letters, digits and - _ . "
            "starting with a letter or digit."
        )
        return None
    if not isinstance(options, Mapping):
        found.append(f"{where} must be a mapping of options, not {type(options).__name__}.")
        return None
    kind = options.get("type")
    if kind not in TYPES:
        found.append(f"{where}['type'] must be one of {', '.join(TYPES)}, not {kind!r}.")
        return None
    unknown = sorted(set(map(str, options)) - _KEYS[kind])
    if unknown:
        found.append(f"{where}: unknown option(s) {', '.join(unknown)} for type {kind}.")
    values: dict[str, Any] = {"name": name, "type": kind}
    kinds = _words(options.get("kinds", KINDS), f"{where}['kinds']", found)
    if kinds is not None:
        bad = sorted(kinds - set(KINDS))
        if bad or not kinds:
            found.append(
                f"{where}['kinds']: {', '.join(bad) or 'empty'}; the kinds are {', '.join(KINDS)}."
            )
        values["kinds"] = kinds
    if options.get("tags") is not None:
        tags = _words(options["tags"], f"{where}['tags']", found)
        values["tags"] = frozenset(t.strip().lower() for t in tags or ())
    for key in ("group_wait", "group_interval", "backoff", "backoff_max"):
        if key in options:
            values[key] = _duration(options[key], f"{where}[{key!r}]", found)
    attempts = options.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100:
        found.append(
            f"{where}['max_attempts'] must be a whole number from 1 to 100, not {attempts!r}."
        )
    values["max_attempts"] = attempts
    if kind == "email":
        to = options.get("to")
        if (
            isinstance(to, str)
            or not isinstance(to, list | tuple)
            or not to
            or not all(isinstance(a, str) and "@" in a for a in to)
        ):
            found.append(f"{where}['to'] must be a non-empty list of email addresses, not {to!r}.")
        else:
            values["to"] = tuple(to)
        sender = options.get("from")
        if sender is not None and not (isinstance(sender, str) and "@" in sender):
            found.append(f"{where}['from'] must be an email address, not {sender!r}.")
        values["from_email"] = sender
    else:
        url = options.get("url")
        if not isinstance(url, str) or not re.match(r"https?://[^\s/]+", url):
            found.append(f"{where}['url'] must be an http:// or https:// URL, not {url!r}.")
        values["url"] = url
        secret = options.get("secret")
        if not isinstance(secret, str) or len(secret) < 16:
            found.append(
                f"{where}['secret'] must be a string of at least 16 characters "
                "(it signs every request)."
            )
        values["secret"] = secret
        timeout = options.get("timeout", DEFAULT_TIMEOUT)
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout <= MAX_TIMEOUT
        ):
            found.append(
                f"{where}['timeout'] must be seconds above 0, at most {MAX_TIMEOUT:g}, "
                f"not {timeout!r}."
            )
        values["timeout"] = timeout
    if found:
        return None
    return Channel(**values)


def _words(value: Any, where: str, found: list[str]) -> frozenset[str] | None:
    if (
        isinstance(value, str)
        or not isinstance(value, list | tuple | set | frozenset)
        or not all(isinstance(v, str) for v in value)
    ):
        found.append(f"{where} must be a list of strings, not {value!r}.")
        return None
    return frozenset(value)


def _duration(value: Any, where: str, found: list[str]) -> timedelta:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        value = timedelta(seconds=value)
    if not isinstance(value, timedelta) or value < timedelta(0) or value > timedelta(days=1):
        found.append(f"{where} must be a duration (or seconds) from 0 to one day, not {value!r}.")
        return timedelta(0)
    return value
