"""A run records its kind (``JobRun.kind``: scheduled, retry, manual), and a job the occurrence a
person added (``Job.manual_at``) from which the claim tells manual runs apart. Both nullable
columns without a default: added without a rewrite; runs before this migration keep NULL and
are read as before (derived).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('schedapp', '0026_job_tags'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='manual_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='jobrun',
            name='kind',
            field=models.CharField(blank=True, choices=[('scheduled', 'Scheduled'), ('retry', 'Retry'), ('manual', 'Manual')], max_length=9, null=True),
        ),
    ]
