"""What the operator ships for monitoring, as code: alert rules and Grafana dashboards.

``python -m hyperplan.monitoring`` (``make dashboards``) writes the committed renderings:
``deploy/prometheus/alerts.yml``, the chart's ``templates/prometheusrule.yaml``,
``deploy/grafana/*.json`` and the chart's copy of the dashboards; ``--check`` fails when
any of them differs from what the code generates.
"""
