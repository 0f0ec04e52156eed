"""The durable queue: the Store protocol and its SQLite and PostgreSQL backends."""
