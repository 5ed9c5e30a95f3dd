"""Who acts: the authenticated MLflow user on a basic-auth server, else the operating-system user.

Every sign-off, approval, decline, promotion and rollback records an `Actor` (name, host, where the
name came from) beside its time. A name typed on the command line (`--by`, `--approver`) is a claim:
it must equal the identity, and a mismatch is refused and audited (`refuse_claim`).

Code that calls the registry directly (flows, tests, fixtures) may name the actor; on an authenticated
server that name must still be the authenticated user, because the server checks the password behind
it. On the embedded SQLite store there is no password to check: whoever can run unmask can write the
file, so the OS user is the identity and a named actor is taken as given.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass

from registry.connection import RegistryError

OS_USER = "os-user"
MLFLOW_USER = "mlflow-basic-auth"
NAMED = "named-by-caller"


class IdentityMismatch(RegistryError):
    """A name given for an action that is not the identity of whoever runs it."""


@dataclass(frozen=True)
class Actor:
    """Who did something, from which host, and how unmask knows the name (`source`)."""

    name: str
    host: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return {"by": self.name, "host": self.host, "identity": self.source}


def authenticated_user(tracking_uri: str) -> str | None:
    """The MLflow user the client authenticates as: an http(s) server with MLFLOW_TRACKING_USERNAME set."""
    user = os.environ.get("MLFLOW_TRACKING_USERNAME", "").strip()
    return user if user and tracking_uri.startswith(("http://", "https://")) else None


def current_actor(tracking_uri: str) -> Actor:
    """The identity of this process against this store."""
    user = authenticated_user(tracking_uri)
    if user:
        return Actor(user, socket.gethostname(), MLFLOW_USER)
    return Actor(getpass.getuser(), socket.gethostname(), OS_USER)


def actor_for(tracking_uri: str, who: "str | Actor | None") -> Actor:
    """The actor of an action: `who` when given (checked against an authenticated user), else the identity."""
    if who is None:
        return current_actor(tracking_uri)
    name = (who.name if isinstance(who, Actor) else str(who)).strip()
    if not name:
        raise RegistryError("an action needs the name of who does it; leave it out to use your identity")
    user = authenticated_user(tracking_uri)
    if user and name != user:
        raise IdentityMismatch(f"{name!r} is not the authenticated MLflow user {user!r}; "
                               "an action is recorded under the identity that performs it")
    if isinstance(who, Actor):
        return who
    return Actor(name, socket.gethostname(), MLFLOW_USER if user else NAMED)


def check_claim(actor: Actor, claimed: str | None, flag: str) -> None:
    """Raise `IdentityMismatch` when a typed name (`flag` says which option) is not the actor's."""
    if claimed is not None and claimed.strip() != actor.name:
        raise IdentityMismatch(f"{flag} {claimed!r} is not you: you are {actor.name!r} ({actor.source} on "
                               f"{actor.host}); leave {flag} out, or run it as {claimed!r}")
