"""The scopenode client library (moving into its own package; see connection.py)."""

from node.client.connection import *  # noqa: F403
from node.client.connection import __all__ as __all__
