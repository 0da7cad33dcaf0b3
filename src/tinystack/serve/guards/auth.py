"""API keys: `Authorization: Bearer <key>`, checked against SHA-256 hashes in constant time.

Keys come from (both may be used):
  - the environment variable named by `ServeConfig.api_key_env` (default
    TINYSTACK_API_KEYS): plain keys, comma-separated; hashed when read;
  - `ServeConfig.api_key_file`: one lowercase hex SHA-256 of a key per line
    (`# comments` and blank lines ignored), so the file never holds a usable secret.
    `hash_key("my key")`, or `tinystack hash-key < key.txt >> keys.txt` (the key on stdin or at a
    hidden prompt, never on the command line), gives the line for a key.

With no keys configured, authentication is off. The presented key is hashed and
compared with every stored hash using `hmac.compare_digest` (no early exit), so the
response time does not reveal how much of a key matched or which key it was.
The caller's identity for rate limits is the first 12 hex digits of the key's hash.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def load_key_hashes(env_var: str, key_file: str) -> list[str]:
    """Hashes of every configured key; raises ValueError for a malformed key file line."""
    hashes = [hash_key(k.strip()) for k in os.environ.get(env_var, "").split(",") if env_var and k.strip()]
    if key_file:
        for n, line in enumerate(Path(key_file).read_text(encoding="utf-8").splitlines(), 1):
            line = line.split("#", 1)[0].strip().lower()
            if not line:
                continue
            if len(line) != 64 or any(c not in "0123456789abcdef" for c in line):
                raise ValueError(f"{key_file}:{n}: expected a hex SHA-256 (64 characters), got {line[:20]!r}")
            hashes.append(line)
    return hashes


class KeyChecker:
    def __init__(self, hashes: list[str]) -> None:
        self._hashes = [h.encode() for h in hashes]

    @property
    def enabled(self) -> bool:
        return bool(self._hashes)

    def identify(self, authorization: str | None) -> str | None:
        """The caller's id for a valid `Authorization` header value, else None."""
        if authorization is None:
            return None
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        digest = hash_key(key.strip()).encode()
        ok = False
        for stored in self._hashes:  # every hash is compared: time does not depend on which one matched
            ok |= hmac.compare_digest(digest, stored)
        return digest[:12].decode() if ok else None
