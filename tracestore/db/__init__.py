"""Database plumbing: Base, portable types, engines, unit of work, migration helpers."""
