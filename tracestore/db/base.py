"""The one declarative Base: constraint naming and the type map for every table."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import BigInteger, Integer, MetaData
from sqlalchemy.orm import DeclarativeBase

from tracestore.db.types import JSONValue, SafeText, UTCDateTime

# Alembic's recommended convention: every constraint and index gets a stable name on
# both databases, so migrations can drop and alter them by name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Big-integer keys on PostgreSQL (row counts outgrow int4), but plain INTEGER on SQLite,
# where only `INTEGER PRIMARY KEY` is an alias of the rowid and autoincrements.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    """Base of every ORM table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        str: SafeText(),
        # Wire integers are 64-bit (validated), and so are our counts.
        int: BigInteger(),
        datetime: UTCDateTime(),
        dict[str, Any]: JSONValue(),
        list[Any]: JSONValue(),
        Any: JSONValue(),
    }
