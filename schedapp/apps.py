from django.apps import AppConfig


class SchedappConfig(AppConfig):
    name = "schedapp"
    verbose_name = "Scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, worker

        checks.register()
        worker.connect()
