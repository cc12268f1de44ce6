"""The pure parts of notifications: routing by kind, tag and a job's own channels; what one
grouped message says (bounded list, exact counts); the webhook signature and its replay
window; the settings read with the channel and key named."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from schedapp.notify.channels import KINDS, Channel, read_channels, route
from schedapp.notify.messages import LISTED, Event, compose, signature, verify
from tests import examples

AT = datetime(2026, 12, 4, 9, tzinfo=UTC)

EVENTS = st.lists(
    st.builds(
        Event,
        id=st.integers(1, 10**9),
        kind=st.sampled_from(KINDS),
        job_id=st.integers(1, 100),
        job_name=st.sampled_from(["a", "b", "c"]),
        created_at=st.just(AT),
    ),
    min_size=1,
    max_size=200,
)


@hypothesis_settings(max_examples=examples(100))
@given(EVENTS)
def test_a_message_lists_at_most_LISTED_events_and_counts_every_one_by_kind(events):
    digest = compose("ops", events)
    payload = digest.payload
    assert payload["total"] == len(events) == sum(payload["counts"].values())
    for kind, n in payload["counts"].items():
        assert n == sum(e.kind == kind for e in events)
    assert len(payload["events"]) == min(len(events), LISTED)
    assert payload["more"] == len(events) - len(payload["events"])
    assert payload["event_ids"] == [e.id for e in events]
    assert digest.text.count("\n- ") == len(payload["events"])


def test_routing_by_kind_tag_and_the_jobs_own_channels():
    everyone = Channel("all", "webhook")
    billing = Channel("billing", "email", tags=frozenset({"billing"}))
    pager = Channel("pager", "webhook", kinds=frozenset({"dead"}), tags=frozenset())
    channels = {c.name: c for c in (everyone, billing, pager)}
    table = [
        # kind, tags, named, channels
        ("late", [], [], ["all"]),
        ("late", ["billing"], [], ["all", "billing"]),
        ("dead", ["web"], [], ["all"]),
        ("dead", ["web"], ["pager"], ["all", "pager"]),
        ("late", ["web"], ["pager"], ["all"]),  # the pager takes dead only
    ]
    for kind, tags, named, expected in table:
        assert route(channels, kind, tags, named) == expected, (kind, tags, named)


def test_the_signature_covers_timestamp_and_body_and_an_old_one_is_refused():
    body, secret, at = b'{"total":1}', "s" * 20, 1_800_000_000
    sig = signature(secret, at, body)
    assert sig.startswith("sha256=") and len(sig) == 7 + 64
    assert verify(secret, str(at), body, sig, now=at + 10)
    assert not verify(secret, str(at), body + b" ", sig, now=at)  # another body
    assert not verify(secret, str(at + 1), body, sig, now=at)  # another timestamp
    assert not verify("t" * 20, str(at), body, sig, now=at)  # another secret
    assert not verify(secret, str(at), body, sig, now=at + 301)  # a replay, later


def test_settings_problems_name_the_channel_and_the_key():
    channels, problems = read_channels(
        {
            "ok": {"type": "email", "to": ["a@example.com"], "group_wait": 5},
            "Bad Name": {"type": "email", "to": ["a@example.com"]},
            "hook": {"type": "webhook", "url": "http://x", "secret": "s" * 16, "timeout": 0},
            "mail": {"type": "email", "to": "a@example.com", "colour": "red"},
        }
    )
    assert list(channels) == ["ok"] and channels["ok"].group_wait == timedelta(seconds=5)
    assert problems == [
        "SCHEDAPP_NOTIFICATIONS['Bad Name']: a channel name is 1 to 64 lowercase letters, "
        "digits and - _ . starting with a letter or digit.",
        "SCHEDAPP_NOTIFICATIONS['hook']['timeout'] must be seconds above 0, at most 60, not 0.",
        "SCHEDAPP_NOTIFICATIONS['mail']: unknown option(s) colour for type email.",
        "SCHEDAPP_NOTIFICATIONS['mail']['to'] must be a non-empty list of email addresses, "
        "not 'a@example.com'.",
    ]
    assert read_channels([1])[1] == [
        "SCHEDAPP_NOTIFICATIONS must be a mapping of channel name to options, not list."
    ]
