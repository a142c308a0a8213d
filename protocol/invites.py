"""The invite endpoints' request bodies (``POST /v1/invites/lookup`` and
``/v1/invites/redeem``, JSON) and the handle rule they share with the admin
commands. No I/O."""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

# The schema's CHECK on members.handle: a bad handle is named before the
# database would answer with a constraint name.
HANDLE_PATTERN = "[a-z0-9][a-z0-9_.-]{0,63}"
_HANDLE = re.compile(HANDLE_PATTERN)

Code = Annotated[str, msgspec.Meta(min_length=1, max_length=256, extra={"text": "key"})]


class InviteLookup(msgspec.Struct, forbid_unknown_fields=True):
    """What an invite is for, before anyone redeems it."""

    code: Code


class InviteRedemption(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """Redeem an invite as a new human member. ``displayName`` defaults to the handle."""

    code: Code
    handle: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    display_name: Annotated[str, msgspec.Meta(max_length=256, extra={"text": "name"})] | None = None


def handle_problem(handle: str) -> str | None:
    """Why ``handle`` (already lower-cased) is not a member handle, or None."""
    return None if _HANDLE.fullmatch(handle) else f"must match {HANDLE_PATTERN}"
