"""The ops kit (ops/prometheus, ops/grafana) against what schedapp really exports.

Rules and dashboards name metrics as strings; nothing else ties them to the code, so a renamed
metric would leave an alert silently empty. These tests scrape the real registry and the
database-side collector (through ``schedapp.views.metrics``) and compare every name the kit
uses, and run promtool on the rules when it is installed (CI installs Debian's).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from schedapp import metrics
from schedapp.models import JobState, Node, RunStatus

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "ops" / "prometheus" / "schedapp-rules.yml"
RULE_TESTS = ROOT / "ops" / "prometheus" / "schedapp-rules.test.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "schedapp-dashboard.json"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian: apt-get install prometheus; .ci/run installs it)",
)

# Labels Prometheus attaches at scrape time, not schedapp's.
TARGET_LABELS = {"job", "instance"}
# Label values of counters are not all visible in a scrape (a label set appears on first use):
# these are the values schedapp's code passes.
COUNTER_LABEL_VALUES = {
    "status": set(RunStatus.values),
    "kind": set(Node.Kind.values),
    "state": set(JobState.values),
    "outcome": set(metrics.NOTIFICATION_OUTCOMES),
}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"\b(schedapp_[A-Za-z0-9_]+)\b(\s*\{[^}]*\})?")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_RECORDED = re.compile(r"\bschedapp:[A-Za-z0-9_:]+")


# --- what the kit references ---------------------------------------------------------------


def load_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def rule_expressions() -> list[str]:
    return [rule["expr"] for rule in load_rules()]


def dashboard_expressions() -> list[str]:
    dashboard = load_dashboard()
    exprs = [
        target["expr"]
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def references(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(metric name, [(label, operator, value)]) for each schedapp selector in ``expr``."""
    strings = [m.span() for m in _STRING.finditer(expr)]
    found = []
    for match in _SELECTOR.finditer(expr):
        if any(start <= match.start() < end for start, end in strings):
            continue  # a label value or a legend that happens to look like a name
        matchers = _MATCHER.findall(match.group(2) or "")
        found.append((match.group(1), matchers))
    return found


# --- what schedapp exports --------------------------------------------------------------------


def scrape(client: Any) -> dict[str, dict[str, Any]]:
    """Sample name -> {"type", "labels": {label: values seen}} from the metrics view."""
    # Labelled counters show no sample before their first use: use each once.
    metrics.run_finished("succeeded")
    metrics.door_skipped("stale_token")
    metrics.heartbeat("worker")
    metrics.notifications("ops", "sent", ["late"])
    metrics.notification_send_failed("ops")
    metrics.BREACHES_BY_TAG.labels(kind="late", tag="").inc(0)
    response = client.get(reverse("schedapp-metrics"))
    assert response.status_code == 200, response.content[:500]
    exported: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        if not family.name.startswith("schedapp_"):
            continue
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
            "gauge": ("",),
        }.get(family.type, ("",))
        for suffix in suffixes:  # names a family exposes even before its first sample
            exported.setdefault(family.name + suffix, {"type": family.type, "labels": {}})
        for sample in family.samples:
            entry = exported.setdefault(sample.name, {"type": family.type, "labels": {}})
            for label, value in sample.labels.items():
                entry["labels"].setdefault(label, set()).add(value)
    return exported


def problems(exprs: list[str], exported: dict[str, dict[str, Any]], recorded: set[str]) -> list:
    """Every reference in ``exprs`` that schedapp does not export (empty when all is well)."""
    found = []
    for expr in exprs:
        for name in _RECORDED.findall(expr):
            if name not in recorded:
                found.append(f"{name}: not recorded by {RULES.name}")
        for name, matchers in references(expr):
            entry = exported.get(name)
            if entry is None:
                found.append(f"{name}: not exported")
                continue
            for label, op, value in matchers:
                if label in TARGET_LABELS:
                    continue
                if label not in entry["labels"]:
                    found.append(f"{name}: no label {label!r}")
                    continue
                if op not in ("=", "=~") or not re.fullmatch(r"[\w|]+", value):
                    continue  # only plain values and alternations can be checked
                # A gauge's scrape lists every value; a counter's, only those used so far.
                known = entry["labels"][label]
                if entry["type"] != "gauge":
                    known = COUNTER_LABEL_VALUES.get(label, known)
                for word in value.split("|"):
                    if word not in known:
                        found.append(f"{name}: {label}={word!r} never exported")
    return found


def recorded_names() -> set[str]:
    return {rule["record"] for rule in load_rules() if "record" in rule}


# --- (a) every metric name exists -------------------------------------------------------------


@pytest.mark.django_db
def test_rules_and_dashboard_use_only_metrics_schedapp_exports(client):
    exported = scrape(client)
    rules, dashboard = rule_expressions(), dashboard_expressions()

    for where, exprs in ((RULES.name, rules), (DASHBOARD.name, dashboard)):
        found = problems(exprs, exported, recorded_names())
        assert not found, f"{where} uses what schedapp does not export:\n" + "\n".join(found)
    # The extraction itself works: both files name counters, histograms and fleet gauges.
    used = {name for expr in rules + dashboard for name, _ in references(expr)}
    assert {
        "schedapp_beat_ticks_total",
        "schedapp_dispatch_lag_seconds_bucket",
        "schedapp_nodes_alive",
        "schedapp_oldest_due_seconds",
        "schedapp_dead_letters_total",
        "schedapp_lease_expiries_total",
        "schedapp_publish_failures_total",
        "schedapp_leases_lost_total",
        "schedapp_stale_completions_total",
    } <= used
    assert len({name for expr in dashboard for name, _ in references(expr)}) >= 20


@pytest.mark.django_db
def test_the_name_check_fails_on_a_renamed_metric_or_label(client):
    exported = scrape(client)
    del exported["schedapp_claims_total"]  # as if CLAIMS had been renamed
    labels = exported["schedapp_jobs"]["labels"]
    labels["status"] = labels.pop("state")  # as if the label had been renamed

    found = problems(dashboard_expressions(), exported, recorded_names())

    assert "schedapp_claims_total: not exported" in found
    assert "schedapp_jobs: no label 'state'" in found
    assert problems(['schedapp_nodes_alive{kind="beats"}'], scrape(client), set()) == [
        "schedapp_nodes_alive: kind='beats' never exported"
    ]
    assert problems(["schedapp:nope:rate5m"], exported, recorded_names()) == [
        f"schedapp:nope:rate5m: not recorded by {RULES.name}"
    ]


# --- (b) promtool ---------------------------------------------------------------------------


@needs_promtool
def test_promtool_check_rules():
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_promtool_test_rules():
    # promtool finds the rule file relative to the test file
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_dashboard_expressions_are_valid_promql(tmp_path):
    # promtool parses rule expressions: check the panels' once Grafana's variables are filled.
    substitutions = {"$__rate_interval": "1m", "$job": ".*", "$instance": ".*"}
    rules = []
    for i, expr in enumerate(dashboard_expressions()):
        if expr.startswith("label_values("):
            continue  # Grafana's variable query syntax, not PromQL
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"unknown variable in {expr}"
        rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_silent():
    alerts = {rule["alert"] for rule in load_rules() if "alert" in rule}
    cases = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    fired = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}

    assert alerts - fired == set(), "alerts never fired by a unit test"
    assert alerts - silent == set(), "alerts never checked silent by a unit test"
    assert (fired | silent) - alerts == set(), "tests of alerts that do not exist"


def test_alerts_say_how_bad_what_and_what_to_do():
    for rule in load_rules():
        if "alert" not in rule:
            continue
        assert rule["alert"].startswith("Schedapp"), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        for key in ("summary", "description", "runbook"):
            assert rule["annotations"].get(key, "").strip(), f"{rule['alert']}: no {key}"


# --- (c) the dashboard --------------------------------------------------------------------------


def test_dashboard_parses_and_every_panel_has_a_target():
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert {"job", "instance"} <= set(variables)
    assert dashboard["schemaVersion"] >= 36  # Grafana 9.x/10 JSON model

    panels = dashboard_panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    rows = [panel["title"] for panel in panels if panel["type"] == "row"]
    assert len(rows) == 6, rows
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"], f"{panel['title']} has no target"
        for target in panel["targets"]:
            assert target["expr"].strip(), f"{panel['title']}: empty expression"
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
