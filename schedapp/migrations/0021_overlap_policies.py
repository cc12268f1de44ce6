"""Overlap policies and fixed delay (``Job.overlap``, ``max_buffer``, ``fixed_delay``, and for
cancel_other / terminate_other ``supersede_at`` and ``superseded``; their index is 0022's), two
fates of the occurrence ledger (``overlapped``, ``buffer_full``). The one-call success that
knows them (``schedapp_succeed_run_v3``) is 0024's: it reads 0023's ``dst_policy`` too.

The columns are added with database defaults (``buffer_one``, 100, false): today's behaviour
for every existing job and for rows an older release's processes insert during a rolling
deploy. A constant default and no check constraint: PostgreSQL adds each column without
rewriting or scanning the table. ``max_buffer`` is checked by the API (1 to 100,000), and an
unknown ``overlap`` written behind its back quarantines the job when a run of it ends.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0020_catchup_window")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="fixed_delay",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="An interval counted from the end of each run (a fixed delay between "
                "runs) rather than from its first occurrence (a fixed rate).",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="max_buffer",
            field=models.IntegerField(
                db_default=100,
                default=100,
                help_text="buffer_all: at most this many of them run after the run in flight "
                "(the most recent); older ones are dropped and recorded.",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="overlap",
            field=models.CharField(
                choices=[
                    ("skip", "Skip occurrences that come due while a run is in flight"),
                    ("buffer_one", "Buffer one: it waits for the run (then the misfire policy)"),
                    ("buffer_all", "Buffer all (up to max_buffer): each runs after the run"),
                    (
                        "cancel_other",
                        "Cancel the run in flight (revoke); the latest then runs",
                    ),
                    (
                        "terminate_other",
                        "Terminate the run in flight (SIGTERM); the latest runs",
                    ),
                ],
                db_default="buffer_one",
                default="buffer_one",
                help_text="What becomes of occurrences that come due while a run of this job is "
                "in flight (decided when it ends).",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="supersede_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="superseded",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.AlterField(
            model_name="occurrence",
            name="fate",
            field=models.CharField(
                choices=[
                    ("misfired", "Misfired (found late; the misfire policy ran another or none)"),
                    ("outside_window", "Outside the catch-up window"),
                    ("paused", "Passed while paused"),
                    ("cancelled", "Job cancelled"),
                    ("quarantined", "Job quarantined"),
                    ("overlapped", "Overlapped a run in flight (overlap policy skip)"),
                    ("buffer_full", "Dropped from a full buffer (overlap policy buffer_all)"),
                ],
                max_length=16,
            ),
        ),
    ]
