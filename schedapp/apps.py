from django.apps import AppConfig


class SchedappConfig(AppConfig):
    name = "schedapp"
    verbose_name = "Scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, worker
        from .celeryapp import celery_app

        checks.register()
        # Before Celery builds a worker's boot steps: Django is set up while the worker
        # imports its modules, which comes first.
        worker.connect(celery_app())
