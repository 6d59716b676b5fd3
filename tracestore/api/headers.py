"""A request's headers read raw from the ASGI scope, in one pass.

Starlette's `Headers.get` builds a Headers object and raises and catches a KeyError for
each header absent, as Content-Encoding mostly is: a few microseconds on every post
(bench/README.md item 24). The hot path (the body limits, the body's encoding and media
type) reads the few headers it needs here instead.
"""

from __future__ import annotations

from starlette.types import Scope


def first_headers(scope: Scope, names: frozenset[bytes]) -> dict[bytes, bytes]:
    """The value of each header of `names` the request has: the first of a repeated
    header, as Starlette's `Headers.get` takes it.

    Names are compared as they are, lower-case: ASGI servers must send them so, and
    Starlette compares them the same way.
    """
    found: dict[bytes, bytes] = {}
    wanted = len(names)
    for name, value in scope.get("headers", ()):
        if name in names and name not in found:
            found[name] = value
            if len(found) == wanted:
                break
    return found
