"""Sign-in: AUTH=user:password[,user2:password2] or AUTH_FILE (one `user:password` per line).

A password may be stored hashed as `pbkdf2_sha256$<iterations>$<salt hex>$<hash hex>`; make one with
`python -m engine.auth USER` (asks for the password). Gradio's own auth then guards the UI and the API
(gradio_client: `Client(url, auth=(user, password))`). Comparisons take constant time.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

HASH_PREFIX = "pbkdf2_sha256"
ITERATIONS = 200_000
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class AuthError(ValueError):
    """AUTH / AUTH_FILE could not be read; the message names the setting and the line."""


def hash_password(password: str, iterations: int = ITERATIONS) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return f"{HASH_PREFIX}${iterations}${salt.hex()}${digest.hex()}"


def _matches(stored: str, password: str) -> bool:
    if not stored.startswith(HASH_PREFIX + "$"):
        return hmac.compare_digest(stored.encode(), password.encode())
    _, iterations, salt, digest = stored.split("$")
    candidate = hashlib.pbkdf2_hmac("sha256", password.encode(), bytes.fromhex(salt), int(iterations))
    return hmac.compare_digest(candidate.hex(), digest)


@dataclass(frozen=True)
class Users:
    """The accounts allowed in; callable as Gradio's `auth=` function."""

    accounts: dict[str, str]  # user -> password or hash

    def __call__(self, username: str, password: str) -> bool:
        stored = self.accounts.get(username)
        return stored is not None and _matches(stored, password)

    @classmethod
    def parse(cls, auth: str | None, auth_file: str | None) -> Users | None:
        entries: list[tuple[str, str]] = []
        if auth:
            entries += [("AUTH", item) for item in auth.split(",") if item.strip()]
        if auth_file:
            path = Path(auth_file)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise AuthError(f"AUTH_FILE: cannot read it ({exc.strerror})") from None
            entries += [(f"AUTH_FILE line {n}", line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if not entries:
            return None
        accounts = {}
        for where, item in entries:
            user, sep, password = item.strip().partition(":")
            if not sep or not password or not _SAFE_NAME.match(user):
                raise AuthError(f"{where}: expected user:password with a user name of letters, digits, _ . -")
            if password.startswith(HASH_PREFIX + "$") and len(password.split("$")) != 4:
                raise AuthError(f"{where}: a hashed password is {HASH_PREFIX}$<iterations>$<salt>$<hash>")
            accounts[user] = password
        return cls(accounts)


def main() -> None:
    """`python -m engine.auth USER`: print an AUTH_FILE line with a hashed password."""
    if len(sys.argv) != 2:
        sys.exit("usage: python -m engine.auth USER")
    password = getpass.getpass("password: ")
    print(f"{sys.argv[1]}:{hash_password(password)}")


if __name__ == "__main__":
    main()
