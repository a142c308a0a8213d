"""Short-lived signed download links (docs/security.md#attachment-links). No I/O.

A browser tab cannot send the bearer token, so ``POST
/v1/attachments/<id>/link`` hands a member a URL that names the credential it
asked with, an expiry a minute ahead and an HMAC of both with the attachment
id. The key is the credential's stored token hash: every node of the
database can check a link, nobody without the database can forge one, and
revoking the token (or deactivating its member) ends its links at once. The
download re-checks that the credential's member may read the attachment, so
a link is never more than a minute of the access its member already has.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlencode

LINK_SECONDS = 60
_SIGNATURE_LENGTH = 64  # hex of SHA-256
_BIGINT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Link:
    credential_id: int
    expires: int
    signature: str


_NOBODYS = Link(0, 0, "")


def signature(key: bytes, attachment_id: str, credential_id: int, expires: int) -> str:
    message = f"{attachment_id}\n{credential_id}\n{expires}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def link_path(
    prefix: str, attachment_id: str, key: bytes, credential_id: int, now: float
) -> tuple[str, int]:
    """The signed path of a download and its expiry (Unix seconds)."""
    expires = int(now) + LINK_SECONDS
    query = urlencode(
        {
            "credential": credential_id,
            "expires": expires,
            "signature": signature(key, attachment_id, credential_id, expires),
        }
    )
    return f"{prefix}/{quote(attachment_id, safe='')}?{query}", expires


def parse(query: str) -> Link | None:
    """The link a download's query names, or None when it names none (a
    download with the bearer token). A malformed one is a link nobody signed."""
    fields = parse_qs(query, keep_blank_values=True)
    if "signature" not in fields:
        return None
    try:
        (credential,), (expires,), (signed,) = (
            fields["credential"],
            fields["expires"],
            fields["signature"],
        )
        link = Link(int(credential), int(expires), signed)
    except (KeyError, ValueError):
        return _NOBODYS
    return link if 0 < link.credential_id <= _BIGINT and 0 < link.expires <= _BIGINT else _NOBODYS


def is_valid(link: Link, attachment_id: str, key: bytes, now: float) -> bool:
    """Signed with ``key`` for this attachment, and not expired."""
    if (
        not now <= link.expires <= now + LINK_SECONDS + 1
        or len(link.signature) != _SIGNATURE_LENGTH
    ):
        return False
    expected = signature(key, attachment_id, link.credential_id, link.expires)
    return hmac.compare_digest(expected, link.signature)
