"""The Faust log-cache worker: a bounded in-memory cache of upstream changelogs, served as Arrow IPC."""
