"""A node that commits sends but pushes nothing, as if it died between commit
and first delivery (only the outbox rows remain).

``python -m tests.mute_sends_node serve …`` runs ``node.cli.main`` in this
process with ``Hub.publish_messages`` replaced by a no-op. The product has no
switch for this; only this process is patched.
"""

from __future__ import annotations

import sys
from typing import Any

from node.cli import main
from node.hub import Hub


def _push_nothing(self: Hub, *args: Any, **kwargs: Any) -> None:
    return None


Hub.publish_messages = _push_nothing  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
