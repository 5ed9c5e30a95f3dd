"""Who acts: the authenticated MLflow user on a basic-auth server, else the operating-system account.

Every sign-off, approval, decline, promotion and rollback records an `Actor` (name, host, where the
name came from) beside its time. A name typed on the command line (`--by`, `--approver`) is a claim:
it must equal the identity, and a mismatch is refused and audited (`refuse_claim`).

This module is the one place an identity is resolved. On the embedded SQLite store (or a server that does
not authenticate) the identity is the OS account of the real uid, read from the password database
(`os_account`): `$LOGNAME`, `$USER` or a flag change nothing. Code that calls the registry directly (flows,
tests, fixtures) may name the actor; on an authenticated server that name must still be the authenticated
user, because the server checks the password behind it; elsewhere the name is only a label, recorded with the
OS account that typed it (`Actor.account`). Where roles need distinct people (four eyes), the person is the
authenticated user, else that OS account (`gates.promotion.person`): one OS account is one person whatever
names it types, so staging and production need an authenticated server. A user name is recorded as
`mlflow-basic-auth` only when the server really authenticated it (its basic-auth `users/current` endpoint
answered with that user).
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gates.promotion import AUTHENTICATED
from gates.roles import Roles
from gates.signatures import SIGNED
from registry import audit, keys
from registry.audit import AuditEvent
from registry.connection import RegistryError
from registry.store import now_iso

if TYPE_CHECKING:
    from registry.store import Registry

OS_USER = "os-user"
MLFLOW_USER = AUTHENTICATED  # a name the tracking server authenticated (users/current answered with it)
NAMED = "named-by-caller"


class IdentityMismatch(RegistryError):
    """A name given for an action that is not the identity of whoever runs it."""


@dataclass(frozen=True)
class Actor:
    """Who did something, from which host, and how unmask knows the name (`source`)."""

    name: str
    host: str
    source: str
    account: str = ""  # the OS account of the process that acted ("" in data from before it was recorded)

    def to_dict(self) -> dict[str, str]:
        return {"by": self.name, "host": self.host, "identity": self.source, "account": self.account or self.name}


def os_account() -> str:
    """The name of the real uid in the password database: what no environment variable can change."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (a container's arbitrary uid)
        return f"uid-{os.getuid()}"


_authenticated: dict[tuple[str, str, str], bool] = {}  # (server, user, password hash) -> the server said so


def server_authenticated(tracking_uri: str, user: str, password: str, timeout_s: float = 10.0) -> bool:
    """Whether the server checks credentials and took these: its basic-auth `users/current` answers with `user`.

    A server without authentication has no such endpoint (404) and would accept any name, so a name set in
    MLFLOW_TRACKING_USERNAME for it is not an identity. Asked once per process, server and credentials.
    """
    key = (tracking_uri.rstrip("/"), user, base64.b64encode(password.encode()).decode())
    if key not in _authenticated:
        request = urllib.request.Request(
            f"{key[0]}/api/2.0/mlflow/users/current",
            headers={"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                said = json.loads(answer.read() or b"{}")
            _authenticated[key] = (said.get("user") or {}).get("username") == user
        except (urllib.error.URLError, OSError, ValueError):  # 404 (no auth), 401 (wrong password), unreachable
            _authenticated[key] = False
    return _authenticated[key]


def authenticated_user(tracking_uri: str) -> str | None:
    """The MLflow user the client authenticates as: an http(s) server that checked MLFLOW_TRACKING_USERNAME's
    password (`server_authenticated`), else None."""
    user = os.environ.get("MLFLOW_TRACKING_USERNAME", "").strip()
    if not user or not tracking_uri.startswith(("http://", "https://")):
        return None
    return user if server_authenticated(tracking_uri, user, os.environ.get("MLFLOW_TRACKING_PASSWORD", "")) else None


def current_actor(tracking_uri: str) -> Actor:
    """The identity of this process against this store: the authenticated user, else the person this user's keys
    folder acts as (`registry.keys`; proved by the signature `signing_actor` adds), else the OS account."""
    user = authenticated_user(tracking_uri)
    if user:
        return Actor(user, socket.gethostname(), MLFLOW_USER, os_account())
    account = os_account()
    person = keys.default_person()
    if person:
        return Actor(person, socket.gethostname(), NAMED, account)
    return Actor(account, socket.gethostname(), OS_USER, account)


def signing_actor(actor: Actor, roles: Roles) -> tuple[Actor, keys.Signer | None]:
    """`actor` and the personal key that signs for them (None where this user's keys folder holds none). Where the
    roles file lists keys, a signed act is the key owner's (source `ed25519-key`: two listed keys are two people,
    with or without a server); elsewhere the signature is kept, and the person is who it was before."""
    signer = keys.signer(actor.name)
    if signer is not None and roles.signed and actor.source != MLFLOW_USER:
        actor = Actor(actor.name, actor.host, SIGNED, actor.account)
    return actor, signer


def actor_for(tracking_uri: str, who: str | Actor | None) -> Actor:
    """The actor of an action: `who` when given (checked against an authenticated user), else the identity."""
    if who is None:
        return current_actor(tracking_uri)
    name = (who.name if isinstance(who, Actor) else str(who)).strip()
    if not name:
        raise RegistryError("an action needs the name of who does it; leave it out to use your identity")
    user = authenticated_user(tracking_uri)
    if user and name != user:
        raise IdentityMismatch(
            f"{name!r} is not the authenticated MLflow user {user!r}; "
            "an action is recorded under the identity that performs it"
        )
    if isinstance(who, Actor):  # built by this module in this process, or refused: no identity is typed in
        if (who.source == MLFLOW_USER) != bool(user) or who.account != os_account():
            here = f"MLflow user {user!r}" if user else "no server authenticated a user"
            raise IdentityMismatch(
                f"actor {who.name!r} ({who.source}, OS account {who.account!r}) is not who acts "
                f"here ({here}; OS account {os_account()!r})"
            )
        return who
    return Actor(name, socket.gethostname(), MLFLOW_USER if user else NAMED, os_account())


def claimed_actor(
    registry: Registry, claimed: str | None, flag: str, action: str, stage: str = "", model: str = "", version: str = ""
) -> Actor:
    """The identity behind a command; a typed name (`flag` says which option) that is not it is refused and
    audited (`identity_refused`)."""
    actor = current_actor(registry.tracking_uri)
    if claimed is None or claimed.strip() == actor.name:
        return actor
    reason = (
        f"{flag} {claimed!r} is not you: you are {actor.name!r} ({actor.source} on {actor.host}); "
        f"leave {flag} out, or run it as {claimed!r}"
    )
    audit.append(
        registry,
        AuditEvent(
            "identity_refused",
            actor.name,
            now_iso(),
            stage,
            model,
            version,
            comment=f"{action}: {reason}",
            evidence={"claimed": claimed, "actor": actor.to_dict()},
        ),
    )
    raise IdentityMismatch(reason)


class PermissionDenied(RegistryError):
    """The tracking server refused an action for the authenticated user (basic-auth permissions)."""


@contextmanager
def server_permissions(tracking_uri: str, model: str = "", action: str = "an action") -> Iterator[None]:
    """Turn the server's 401/403 into one `PermissionDenied` line naming the user and the model."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as e:
        if str(e.error_code) not in ("PERMISSION_DENIED", "UNAUTHENTICATED") and getattr(
            e, "get_http_status_code", lambda: 0
        )() not in (401, 403):
            raise
        user = authenticated_user(tracking_uri) or "(no MLFLOW_TRACKING_USERNAME)"
        what = f"model {model!r}" if model else "the registry"
        raise PermissionDenied(
            f"permission denied: MLflow user {user!r} may not change {what} ({action}; "
            f"{tracking_uri} said {e.error_code}); ask an MLflow admin"
        ) from None
