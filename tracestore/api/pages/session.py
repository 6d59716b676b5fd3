"""Browser sign-in: a signed session cookie instead of the key, and CSRF tokens for forms.

When TRACESTORE_API_KEYS is set a person signs in once on /login with a key; the answer
sets `tracestore_session`, an HttpOnly, SameSite=Lax cookie holding
`name:expires:HMAC-SHA256(key, name:expires)`. The key itself never travels again, in a
cookie or a URL; the token says nothing about it, expires on its own, and dies with the
key (rotating keys signs everyone out). Nothing is stored on the server, so every worker
process checks it alike.

What the cookie may do: only safe requests (GET, HEAD). A browser attaches cookies to
requests other sites trigger, so a cookie that could POST would let any page write to the
store; with this rule no cross-site request can change anything, whatever SameSite says.
Lax (not Strict) lets a link to a run page from a chat or a log viewer open signed in.

The forms that change state (sign in, sign out) carry a CSRF token that must equal the
`tracestore_csrf` cookie (double submit) and come from this origin (`Origin`,
`Sec-Fetch-Site`), so no other site can sign a browser in or out.

This module imports nothing of api/ (api/deps.py calls it from its key check).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping, Sequence

from starlette.requests import Request
from starlette.responses import Response

from tracestore.settings import ApiClient, Settings

SESSION_COOKIE = "tracestore_session"
CSRF_COOKIE = "tracestore_csrf"
CSRF_FIELD = "csrf"
SESSION_SECONDS = 12 * 60 * 60
SAFE_METHODS = frozenset({"GET", "HEAD"})
_CONTEXT = b"tracestore-session:v1:"


def _mac(key: str, name: str, expires: int) -> str:
    message = _CONTEXT + f"{name}:{expires}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def issue_token(client: ApiClient, now: float | None = None) -> str:
    """A session token for `client`, valid for SESSION_SECONDS."""
    expires = int(now if now is not None else time.time()) + SESSION_SECONDS
    return f"{client.name}:{expires}:{_mac(client.key, client.name, expires)}"


def token_client(token: str, clients: Sequence[ApiClient], now: float | None = None) -> str | None:
    """The name of the client a valid, unexpired token was issued to; else None."""
    name, sep, rest = token.partition(":")
    expires_text, sep2, mac = rest.partition(":")
    if not (sep and sep2 and expires_text.isdigit()):
        return None
    expires = int(expires_text)
    if expires < (now if now is not None else time.time()):
        return None
    found = None
    for client in clients:
        # Every key's MAC is computed and compared (no early exit), as deps.identify does.
        same_name = hmac.compare_digest(client.name.encode(), name.encode())
        same_mac = hmac.compare_digest(
            _mac(client.key, client.name, expires).encode(), mac.encode()
        )
        if same_name and same_mac:
            found = client.name
    return found


def session_client(request: Request, settings: Settings) -> str | None:
    """The client a signed-in browser's cookie names, for a safe request; else None."""
    if request.method not in SAFE_METHODS:
        return None
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return None
    return token_client(token, settings.api_clients())


def _secure(request: Request) -> bool:
    # Over HTTPS (directly, or behind a proxy that says so) the cookie is Secure too; on
    # plain HTTP (a laptop, a loopback port) a Secure cookie would never come back.
    forwarded = request.headers.get("x-forwarded-proto", "")
    return request.url.scheme == "https" or forwarded.split(",")[0].strip() == "https"


def set_session(response: Response, request: Request, token: str) -> None:
    """Sign the browser in: the session cookie, HttpOnly and SameSite=Lax."""
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="lax",
        secure=_secure(request),
    )


def clear_session(response: Response, request: Request) -> None:
    """Sign the browser out."""
    response.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, samesite="lax", secure=_secure(request)
    )


def csrf_token(request: Request) -> tuple[str, bool]:
    """The browser's CSRF token, and whether it is new (then set it with `set_csrf`)."""
    token = request.cookies.get(CSRF_COOKIE, "")
    if len(token) == 64 and all(c in "0123456789abcdef" for c in token):
        return token, False
    return secrets.token_hex(32), True


def set_csrf(response: Response, request: Request, token: str) -> None:
    """Give the browser its CSRF token (HttpOnly: forms carry their own copy)."""
    response.set_cookie(
        CSRF_COOKIE, token, path="/", httponly=True, samesite="strict", secure=_secure(request)
    )


def same_origin(request: Request) -> bool:
    """False when the browser says the request came from another site."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        # No Origin: not a browser's cross-site form post (browsers send one on POST);
        # "null" comes from sandboxed or privacy-stripped contexts: refused below by the
        # token check if it does not hold this browser's cookie.
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


def form_is_ours(request: Request, form: Mapping[str, str]) -> bool:
    """A state-changing form from this site: same origin, and its CSRF token equals the
    browser's cookie (compared in constant time)."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = form.get(CSRF_FIELD, "")
    if not cookie or not sent or not same_origin(request):
        return False
    return hmac.compare_digest(cookie.encode(), sent.encode())
