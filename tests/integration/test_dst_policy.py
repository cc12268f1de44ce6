"""A job's DST policy through every door: the API, bulk scheduling (COPY and the ORM), the
admin form and its preview, and the claim, which builds the schedule from the row it read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from schedapp import api, bulk, lease
from schedapp.dispatch import message_headers
from schedapp.lease import Completion, DoorVerdict, admit_run, claim_due_jobs, complete_run
from schedapp.message import RunHeaders
from schedapp.models import Job
from schedapp.schedules import count_fire_times
from schedapp.store import PortableStore
from tests.integration.test_admin import form_data

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "project.tasks.record"
PARIS = ZoneInfo("Europe/Paris")
BAD = ("gap_end", "first", "celery+first", "skip+third", "both", 3, ["celery"], True)


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_the_api_refuses_a_bad_policy_naming_the_field(bad):
    with pytest.raises(ValidationError) as info:
        api.schedule(TASK, cron="30 2 * * *", dst_policy=bad)
    assert list(info.value.message_dict) == ["dst_policy"]
    assert "gap_end+first" in info.value.message_dict["dst_policy"][0]
    assert not Job.objects.exists()


@pytest.fixture(params=["copy-binary", "copy-text", "orm"])
def writer(request, monkeypatch) -> str:
    if request.param == "orm":
        monkeypatch.setattr(bulk, "get_store", PortableStore)
    else:
        monkeypatch.setattr(bulk, "COPY_FORMAT", request.param.removeprefix("copy-"))
    return request.param


def test_schedule_many_stores_each_policy_and_names_a_bad_one(writer):
    specs = [
        {"task": TASK, "name": f"p-{i}", "cron": "30 2 * * *", "dst_policy": policy}
        for i, policy in enumerate(("celery", "skip+both", None, "gap_end+second"))
    ]
    api.schedule_many(specs)
    stored = dict(Job.objects.values_list("name", "dst_policy"))
    assert stored == {
        "p-0": "celery",
        "p-1": "skip+both",
        "p-2": "gap_end+first",
        "p-3": "gap_end+second",
    }
    with pytest.raises(ValidationError) as info:
        api.schedule_many([{"task": TASK, "name": "bad", "cron": "0 1 * * *", "dst_policy": "x"}])
    assert list(info.value.message_dict) == ["0.dst_policy"]


def test_a_policy_is_the_first_fire_time_of_a_new_job():
    """Created just before the 2026 spring change (the database's clock is today's: the
    schedule's first occurrence after an instant is what validation stores)."""
    job = api.schedule(TASK, cron="30 2 * * *", timezone="Europe/Paris", dst_policy="celery")
    assert job.schedule.dst_policy == "celery"
    assert api.update(job.pk, dst_policy="skip+first").dst_policy == "skip+first"


# --- the claim -------------------------------------------------------------------------------

SPRING_EVE = datetime(2026, 3, 28, 2, 30, tzinfo=PARIS)  # the occurrence before the gap
AUTUMN_EVE = datetime(2026, 10, 24, 2, 30, tzinfo=PARIS)


def job_due_at(occurrence: datetime, policy: str, **options) -> Job:
    """A daily 02:30 Paris job whose occurrence ``occurrence`` (in the past) is due now and,
    with a grace of a year (the most a job takes), not late: claimed as an ordinary one."""
    job = api.schedule(
        TASK,
        cron="30 2 * * *",
        timezone="Europe/Paris",
        dst_policy=policy,
        misfire_grace=options.pop("misfire_grace", timedelta(days=365)),
        **options,
    )
    Job.objects.filter(pk=job.pk).update(scheduled_for=occurrence, next_run_at=occurrence)
    return Job.objects.get(pk=job.pk)


def run_once(job: Job, path: str) -> datetime:
    """Claim the job's due occurrence, run it to success as a worker would (``worker``: from
    the message's headers, the path that computes the next occurrence from the schedule the
    claim put in the message when it can) or through the general completion; the occurrence
    it ran."""
    (run,) = claim_due_jobs("beat-1", 10).runs
    assert run.job_id == job.pk
    assert admit_run(job.pk, run.token, "w1", admission=f"w1-{run.token}") is DoorVerdict.ADMITTED
    if path == "worker":
        headers = RunHeaders.read(message_headers(run, "test"))
        (result,) = lease.complete_successes([(job.pk, run.token, headers)])
        assert result.completion is Completion.APPLIED
    else:
        assert complete_run(job.pk, run.token, lease.SUCCEEDED).applied
    return run.scheduled_for


@pytest.mark.parametrize(
    ("policy", "eve", "expected"),
    [
        ("gap_end+first", SPRING_EVE, ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]),
        ("skip+first", SPRING_EVE, ["2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]),
        ("celery", SPRING_EVE, ["2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00"]),
        ("gap_end+first", AUTUMN_EVE, ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]),
        ("skip+second", AUTUMN_EVE, ["2026-10-25T02:30:00+01:00", "2026-10-26T02:30:00+01:00"]),
        ("gap_end+both", AUTUMN_EVE, ["2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00"]),
    ],
)
@pytest.mark.parametrize("path", ["worker", "general"])
def test_the_claim_runs_the_occurrences_the_policy_names(policy, eve, expected, path):
    """The occurrence after the one run is computed at completion from the row (a job with a
    non-default policy takes the general success path), and the claim runs it: the instant
    the policy names across the change."""
    job = job_due_at(eve, policy)
    assert run_once(job, path) == eve
    ran = [run_once(job, path), run_once(job, path)]
    assert ran == [datetime.fromisoformat(t) for t in expected]


@pytest.mark.parametrize(
    ("policy", "eve", "extra"),
    [("skip+first", SPRING_EVE, -1), ("gap_end+both", AUTUMN_EVE, 1), ("celery", SPRING_EVE, 0)],
)
def test_the_claims_misfire_count_follows_the_policy_from_the_row(policy, eve, extra):
    """A late job's missed occurrences are counted by arithmetic from the row the claim read:
    one fewer when the gap is skipped, one more when the repeated hour runs twice."""
    default = job_due_at(eve, "gap_end+first", misfire_grace=60, misfire_policy="skip")
    other = job_due_at(eve, policy, misfire_grace=60, misfire_policy="skip", name="other")
    result = claim_due_jobs("beat-1", 10)
    assert (result.runs, result.skipped_misfires) == ([], 2)
    default.refresh_from_db()
    other.refresh_from_db()
    assert other.missed_runs - default.missed_runs == extra
    assert other.missed_runs == count_fire_times(
        other.schedule, eve, other.scheduled_for - timedelta(microseconds=1)
    )


# --- the admin -------------------------------------------------------------------------------


def test_the_admin_saves_a_policy_and_refuses_a_bad_one(admin_client):
    add = reverse("admin:schedapp_job_add")
    response = admin_client.post(add, form_data(dst_policy="bogus"))
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["dst_policy"]
    assert not Job.objects.exists()
    response = admin_client.post(add, form_data(dst_policy="celery"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Job.objects.get().dst_policy == "celery"


def test_a_post_without_the_field_keeps_the_default(admin_client):
    response = admin_client.post(reverse("admin:schedapp_job_add"), form_data())
    assert response.status_code == 302
    assert Job.objects.get().dst_policy == "gap_end+first"


def test_the_preview_follows_the_policy(admin_client):
    """March's Sundays at 02:30 in Paris: the last one of 2027 (03-28) is in the gap."""

    def preview(policy: str) -> str:
        answer = admin_client.get(
            reverse("admin:schedapp_job_preview"),
            {"cron": "30 2 * 3 0", "timezone": "Europe/Paris", "dst_policy": policy},
        ).json()
        return " | ".join(answer["times"])

    assert "2027-03-28 03:00:00" in preview("gap_end+first")
    assert "2027-03-28 03:30:00" in preview("celery")
    assert "2027-03-28" not in preview("skip+first")
    assert admin_client.get(
        reverse("admin:schedapp_job_preview"),
        {"cron": "30 2 * * *", "timezone": "Europe/Paris", "dst_policy": "bad"},
    ).json()["errors"]["dst_policy"]


def test_nothing_else_changes_for_a_job_stored_before_the_policy():
    """The column's default is today's rule: a row written without it (as rows written before
    the migration read) is the documented default."""
    job = api.schedule(TASK, cron="30 2 * * *", timezone="Europe/Paris")
    assert job.dst_policy == "gap_end+first"
    spring = count_fire_times(
        job.schedule,
        datetime(2026, 3, 29, tzinfo=PARIS).astimezone(UTC),
        datetime(2026, 3, 29, 23, 59, tzinfo=PARIS).astimezone(UTC),
    )
    assert spring == 1  # 02:30 runs at 03:00


# --- imported from Celery ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", [None, "celery"])
def test_imported_crontabs_take_the_import_policy_and_intervals_none(policy):
    from celery.schedules import crontab
    from django.test import override_settings

    from schedapp import importer

    given = {} if policy is None else {"SCHEDAPP_IMPORT_DST_POLICY": policy}
    start = datetime(2026, 3, 28, 23, tzinfo=PARIS)
    with override_settings(**given):
        tab = importer.map_beat_entry(
            "gap", {"task": TASK, "schedule": crontab(minute=30, hour=2)}, "Europe/Paris", start
        )
        every = importer.map_beat_entry(
            "every", {"task": TASK, "schedule": timedelta(hours=1)}, "Europe/Paris", start
        )
    assert tab.spec["dst_policy"] == (policy or "gap_end+first")
    assert "dst_policy" not in every.spec
    job = api.schedule(TASK, name="gap", **tab.spec)
    assert job.dst_policy == (policy or "gap_end+first")


# --- declared in code ------------------------------------------------------------------------


def test_a_declared_job_takes_its_policy_and_a_bad_one_names_job_and_field():
    from django.test import override_settings

    from schedapp import declared

    spec = {"task": TASK, "cron": "30 2 * * *", "timezone": "Europe/Paris"}
    with override_settings(SCHEDAPP_JOBS={"nightly": {**spec, "dst_policy": "skip+both"}}):
        assert declared.sync_declared_jobs().created == ["nightly"]
    assert Job.objects.get(name="nightly").dst_policy == "skip+both"
    with override_settings(SCHEDAPP_JOBS={"nightly": {**spec, "dst_policy": "celery"}}):
        # the whole schedule is restated with it, as with cron_day_or: a new next occurrence
        assert "dst_policy" in declared.sync_declared_jobs().updated["nightly"]
    assert Job.objects.get(name="nightly").schedule.dst_policy == "celery"
    with pytest.raises(ValidationError) as caught:
        declared.declared_values("odd", {**spec, "dst_policy": "sometimes"})
    assert list(caught.value.message_dict) == ["odd.dst_policy"]


def test_the_add_page_offers_the_policies_with_the_cron_fields(admin_client):
    page = admin_client.get(reverse("admin:schedapp_job_add")).content.decode()
    assert page.count('<option value="gap_end+') == 3 and page.count('<option value="skip+') == 3
    assert '<option value="celery"' in page
    assert 'data-fields="cron cron_day_or dst_policy"' in page  # shown for a cron only
