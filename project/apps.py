from typing import Any

from django.apps import AppConfig


def record_deadline_signal(sender: Any, breach: Any, signal: Any, **kwargs: Any) -> None:
    """The demo's receiver of schedapp's deadline signals: each one received is a
    SignalReceived row (label ``signal:<name>:<kind>``), so the end-to-end tests see what a
    beat or worker sent, from the receiving side. Not an Execution: a job gone dead is no
    task body run."""
    import os

    from django.utils import timezone

    from schedapp import signals

    from .models import SignalReceived

    name = "recovered" if signal is signals.job_recovered else breach.kind
    SignalReceived.objects.create(
        label=f"signal:{name}:{breach.kind}",
        job_id=breach.job_id,
        scheduled_for=breach.scheduled_for,
        pid=os.getpid(),
        received_at=timezone.now(),
    )


class ProjectConfig(AppConfig):
    name = "project"
    verbose_name = "Demo project"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from schedapp import signals

        for signal in (*signals.BREACH_SIGNALS.values(), signals.job_recovered):
            signal.connect(record_deadline_signal, dispatch_uid="project.deadline_signals")
