"""Queries and writes over the store; functions take a Session and never commit."""
