from django.db import migrations, models


def anchor_intervals(apps, schema_editor):
    """An interval job's occurrences stay where they are: its current one is the anchor."""
    Job = apps.get_model("schedapp", "Job")
    Job.objects.filter(interval__isnull=False, interval_anchor__isnull=True).update(
        interval_anchor=models.F("scheduled_for")
    )


class Migration(migrations.Migration):
    dependencies = [("schedapp", "0003_bounded_priority")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="interval_anchor",
            field=models.DateTimeField(
                blank=True,
                help_text="An interval's occurrences fall at this instant plus whole intervals "
                "(default: its first occurrence), so extra runs never shift them.",
                null=True,
            ),
        ),
        migrations.RunPython(anchor_intervals, migrations.RunPython.noop),
    ]
