from django.apps import AppConfig


class ProjectConfig(AppConfig):
    name = "project"
    verbose_name = "Demo project"
    default_auto_field = "django.db.models.BigAutoField"
