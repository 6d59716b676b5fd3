"""The store's own identity: what tells its rows apart from another store's in one lake."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Mapped, mapped_column

from tracestore.db.base import Base


class StoreIdentity(Base):
    """One row: the store's id, drawn at random by migration 0005 (issue 15).

    Every row `tracestore export` writes carries it, so several stores can share one lake
    (run_ids are unique only within a store) and an export never mixes into another
    store's snapshot by mistake. It survives moving the file or a dump and restore; a
    copied store keeps it too (give the copy a new one before exporting both).
    """

    __tablename__ = "store_identity"

    store_id: Mapped[str] = mapped_column(primary_key=True)
    created_at: Mapped[datetime]
