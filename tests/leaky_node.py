"""A node with a planted leak, for the soak bench's slow test.

``python -m tests.leaky_node serve …`` runs ``node.cli.main`` in this process
after wrapping the send handler the sessions call so that each send keeps
about ``LEAK_BYTES`` in a module-level list that is never trimmed: an uncapped
cache, the kind of growth the soak must call ``growing``. The product has no
switch for this; only this process is patched.
"""

from __future__ import annotations

import sys
from typing import Any

import node.session
from node.cli import main
from node.ops.messages import submit_send as _submit_send

LEAK_BYTES = 20 * 1024
RETAINED: list[bytes] = []


async def _leaky_submit_send(services: Any, member: Any, request: Any, *args: Any) -> None:
    # Repeated content, so every page of the copy is written and counts in RSS.
    seed = (request.content or ".").encode()
    RETAINED.append((seed * (LEAK_BYTES // len(seed) + 1))[:LEAK_BYTES])
    await _submit_send(services, member, request, *args)


# The session module looks the handler up by name at each send.
vars(node.session)["submit_send"] = _leaky_submit_send

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
