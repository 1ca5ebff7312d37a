"""deploy/prometheus: the scrape config, the alert rules and their unit tests, each checked by
promtool (Debian's prometheus package)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy.support import DEPLOY, run_tool

PROMETHEUS = DEPLOY / "prometheus"


def _ok(*argv: str) -> str:
    result = run_tool(*argv, cwd=PROMETHEUS)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_promtool_accepts_the_scrape_config() -> None:
    assert "SUCCESS" in _ok("promtool", "check", "config", "prometheus.yml")


def test_promtool_accepts_the_alert_rules() -> None:
    assert "SUCCESS" in _ok("promtool", "check", "rules", "alerts.yml")


def test_the_alert_rules_pass_their_unit_tests() -> None:
    # alerts_test.yml: a growing depth fires and a steady one does not, and the same kind of
    # pair for every other rule
    assert "SUCCESS" in _ok("promtool", "test", "rules", "alerts_test.yml")


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert names - fired == set(), "alerts without a test that fires them"
    for g in rules["groups"]:
        for rule in g["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    # the check is real: a rule with a PromQL syntax error fails it
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rate(x[5m]\n"
    )
    result = run_tool("promtool", "check", "rules", str(broken))
    assert result.returncode != 0
