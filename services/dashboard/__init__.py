"""The lag dashboard: a read-only web page, its JSON API and Prometheus ``/metrics``."""
