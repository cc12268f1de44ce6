"""The demo's own tables: every task execution records itself in ``Execution``, so tests can
check what really ran from the task's side, not only from schedapp's bookkeeping; every
deadline signal received is a ``SignalReceived`` (apart, so that signals never count as
executions)."""

from django.db import models


class Execution(models.Model):
    label = models.CharField(max_length=200, db_index=True)
    job_id = models.BigIntegerField(null=True, db_index=True)
    token = models.BigIntegerField(null=True)
    attempt = models.PositiveIntegerField(null=True)
    scheduled_for = models.DateTimeField(null=True)
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    task_id = models.CharField(max_length=255, blank=True, default="")
    worker = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.label} job={self.job_id} at {self.started_at:%H:%M:%S.%f}"


class SignalReceived(models.Model):
    label = models.CharField(max_length=200, db_index=True)  # signal:<name>:<kind>
    job_id = models.BigIntegerField(null=True, db_index=True)
    scheduled_for = models.DateTimeField(null=True)
    pid = models.IntegerField(null=True)
    received_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.label} job={self.job_id}"
