"""A node that commits edits and deletes but pushes nothing, as if it died
between commit and projection (only the outbox row remains).

``python -m tests.mute_mutations_node serve …`` runs ``node.cli.main`` in this
process with ``Hub.publish_mutation`` replaced by a no-op. The product has no
switch for this; only this process is patched.
"""

from __future__ import annotations

import sys
from typing import Any

from node.cli import main
from node.hub import Hub


def _push_nothing(self: Hub, *args: Any, **kwargs: Any) -> None:
    return None


Hub.publish_mutation = _push_nothing  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
