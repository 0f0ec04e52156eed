"""Opening the store a URL names: the one place that knows both backends.

Kept apart from ``protocol`` so the backends can import the contract without a cycle.
"""

from __future__ import annotations

import os

from fleet_tui.scheduler.store.protocol import Store, StoreError, check_store_url, sqlite_path


def open_store(url: str | None, home: str, *, readonly: bool = False) -> Store:
    """The store for a URL: postgresql://... -> PostgresStore, sqlite:///PATH or nothing (the
    home's fleet.db) -> SqliteStore. Any other URL is refused (StoreError), never replaced by the
    default: a typo must not queue work into another store.

    ``readonly``: the caller only reads (status, logs, questions, plan, hosts); the store is
    opened without taking a write lock, so it works while another process writes, on a read-only
    home and on a full disk. An explicit SQLite file that does not exist is refused then, and its
    folder must exist otherwise (a typo in the path must not create a new, empty store)."""
    if url:
        check_store_url(url)
    if url and url.startswith(("postgresql://", "postgres://")):
        from fleet_tui.scheduler.store.postgres_store import PostgresStore

        return PostgresStore(url)
    from fleet_tui.scheduler.store.sqlite_store import SqliteStore

    if url:
        path = sqlite_path(url)
        if readonly and not os.path.isfile(path):
            raise StoreError(f"no store at {path} (from --store {url}): check the path")
        if not os.path.isdir(os.path.dirname(path)):
            raise StoreError(
                f"no folder {os.path.dirname(path)} for the store {url}: create it first, or fix the path"
            )
        return SqliteStore(path, readonly=readonly)
    return SqliteStore(os.path.join(home, "fleet.db"), readonly=readonly)
