"""``schedapp.conf.get_settings`` keeps what it read, and still sees every change Django's
ways of changing settings in a test make."""

from __future__ import annotations

from typing import Any

from django.test import override_settings

from schedapp.conf import get_settings


def test_the_settings_read_are_kept_until_a_setting_changes() -> None:
    assert get_settings() is get_settings()


def test_override_settings_is_seen_and_undone() -> None:
    before = get_settings().BATCH_SIZE
    with override_settings(SCHEDAPP_BATCH_SIZE=before + 7):
        assert get_settings().BATCH_SIZE == before + 7
    assert get_settings().BATCH_SIZE == before


def test_the_settings_fixture_is_seen_when_set_and_when_deleted(settings: Any) -> None:
    settings.SCHEDAPP_MAX_SLEEP = 0.75
    assert get_settings().MAX_SLEEP == 0.75
    settings.SCHEDAPP_MAX_SLEEP = 2.5  # a second change under the first override
    assert get_settings().MAX_SLEEP == 2.5
    del settings.SCHEDAPP_MAX_SLEEP  # no setting_changed is sent for a deletion
    assert get_settings().MAX_SLEEP == 5.0  # the default


def test_a_changed_setting_of_the_current_settings_is_seen() -> None:
    """``override_settings`` inside another: the inner change, then the outer one again."""
    with override_settings(SCHEDAPP_RELEASE="41"):
        assert get_settings().RELEASE == "41"
        with override_settings(SCHEDAPP_RELEASE="100"):
            assert get_settings().RELEASE == "100"
        assert get_settings().RELEASE == "41"
