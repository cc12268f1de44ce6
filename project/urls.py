from django.contrib import admin
from django.urls import path

from schedapp.views import metrics

urlpatterns = [path("admin/", admin.site.urls), path("metrics/", metrics, name="schedapp-metrics")]
