"""Prometheus metrics of every run, from the read model and the log (`scrape`), with the alert rules and the
Grafana dashboard shipped beside them (`ftrain.rules.yml`, `grafana-dashboard.json`: docs/metrics.md)."""
