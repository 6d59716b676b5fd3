"""A request's headers read raw from the ASGI scope, in one pass.

Starlette's `Headers.get` builds a Headers object and raises and catches a KeyError for
each header absent, as Content-Encoding mostly is: a few microseconds on every post
(bench/README.md item 24). The hot path (the body limits, the body's encoding and media
type) reads the few headers it needs here instead.
"""

from __future__ import annotations

from starlette.types import Scope


def first_headers(scope: Scope, names: frozenset[bytes]) -> dict[bytes, bytes]:
    """The value of each header of `names` (lower-case) the request has: the first of a
    repeated header, as Starlette's `Headers.get` takes it."""
    found: dict[bytes, bytes] = {}
    for key, value in scope.get("headers", ()):
        # ASGI servers send names lower-case; a hand-built scope (a test, an embedding
        # app) may not.
        name = key.lower()
        if name in names and name not in found:
            found[name] = value
    return found
