"""A job's description (free text for people; django-celery-beat's PeriodicTask.description,
which schedapp_import carries over). Its database default ('') lets rows written without it
(an older release's COPY during a rolling deploy) get one; on PostgreSQL 11+ adding a column
with a constant default rewrites nothing."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("schedapp", "0013_run_recent_policy"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="description",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
    ]
