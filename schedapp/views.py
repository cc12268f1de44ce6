"""Optional views: ``path("metrics/", schedapp.views.metrics)`` in a project's URLconf.

``SCHEDAPP_METRICS_TOKEN``, when set, must be sent as ``Authorization: Bearer <token>``
(Prometheus: ``authorization: {credentials: ...}``); without it the view is open, like
``prometheus_client``'s own HTTP server, so protect it at the proxy.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from . import metrics as _metrics
from .conf import get_settings


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition: this host's schedapp processes and fleet gauges from the DB."""
    token = get_settings().METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return HttpResponse("unauthorised\n", status=401, content_type="text/plain")
    try:
        body, content_type = _metrics.exposition()
    except _metrics.MetricsUnavailable as exc:
        return HttpResponse(f"{exc}\n", status=503, content_type="text/plain")
    return HttpResponse(body, content_type=content_type)
