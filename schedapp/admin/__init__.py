"""The Django admin for schedapp: jobs, runs, fleet nodes and an overview page.

Django's admin autodiscovery imports ``schedapp.admin``; importing this package registers
the four ModelAdmins. One module per concern:

* ``jobs``: ``JobAdmin`` (changelist, job page, save through ``schedapp.api``);
* ``views``: the job admin's own pages (buttons, schedule preview, overview);
* ``operations``: what an operator may do to a job, for actions and buttons alike;
* ``runs``: read-only run history and fleet nodes;
* ``filters``: paginator and filters that stay fast on millions of rows;
* ``forms``: the job form, validated with the API's own rules;
* ``calendars``: ``CalendarAdmin`` (a calendar's definition, and its next year's excluded days);
* ``notifications``: ``NotificationAdmin``, the outbox read-only (sent, pending, failed);
* ``backfills``: ``BackfillAdmin``, the backfills page (progress, Cancel) and a job's
  "Backfill..." form;
* ``attention``: the "needs attention" page (open breaches, failed deliveries), listed on the
  index through the ``Attention`` proxy.
"""

from __future__ import annotations

from django.contrib import admin

from ..models import Attention, Backfill, Calendar, Job, JobRun, Node, Notification
from .attention import AttentionAdmin
from .backfills import BackfillAdmin
from .calendars import CalendarAdmin
from .jobs import JobAdmin
from .notifications import NotificationAdmin
from .runs import JobRunAdmin, NodeAdmin

__all__ = [
    "AttentionAdmin",
    "BackfillAdmin",
    "CalendarAdmin",
    "JobAdmin",
    "JobRunAdmin",
    "NodeAdmin",
    "NotificationAdmin",
]

admin.site.register(Job, JobAdmin)
admin.site.register(JobRun, JobRunAdmin)
admin.site.register(Backfill, BackfillAdmin)
admin.site.register(Node, NodeAdmin)
admin.site.register(Calendar, CalendarAdmin)
admin.site.register(Notification, NotificationAdmin)
admin.site.register(Attention, AttentionAdmin)
