"""The audit trail (``JobChange``): who changed a job, from where, when, why, and what.
A new table: nothing existing is read or rewritten."""


import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('schedapp', '0024_succeed_run_v3'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job_id', models.BigIntegerField()),
                ('job_name', models.CharField(max_length=200)),
                ('at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('action', models.CharField(choices=[('created', 'Created'), ('updated', 'Changed'), ('paused', 'Paused'), ('resumed', 'Resumed'), ('run_now', 'Run now'), ('requeued', 'Requeued'), ('cancelled', 'Cancelled'), ('restored', 'Restored to an earlier version'), ('deleted', 'Deleted')], max_length=16)),
                ('source', models.CharField(help_text='The path: api, admin, declared, imported or bulk.', max_length=16)),
                ('actor', models.CharField(help_text='The user, or the process and host that made the change.', max_length=200)),
                ('reason', models.TextField(blank=True, default='')),
                ('changes', models.JSONField(blank=True, null=True)),
            ],
            options={
                'ordering': ['-at', '-id'],
                'indexes': [models.Index(fields=['job_id', 'at'], name='schedapp_jobchange_job')],
            },
        ),
    ]
