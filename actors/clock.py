"""The scope actor's clock: the database's time, carried forward on trio's clock.

Message ``created_at`` is compared with grant ``created_at``/``revoked_at``
(database time) by the readable predicate and its twin, so it must be database
time too, never the node's wall clock. The actor anchors on a database reading
(the snapshot load, then every send statement) and adds the monotonic time
elapsed since. A reading reaches the node after the database took it, so the
estimate trails the database clock: a message timestamped now is never after a
grant change the send commits before. The floor keeps it after everything the
actor knows (its last message, the grant timestamps it loaded), so time never
runs backwards within a scope.
"""

from __future__ import annotations

from datetime import datetime, timedelta


class DbClock:
    __slots__ = ("_db_now", "_mono")

    def __init__(self, db_now: datetime, mono: float) -> None:
        self._db_now = db_now
        self._mono = mono

    def anchor(self, db_now: datetime, mono: float) -> None:
        """A fresh database reading, received at trio time ``mono``."""
        self._db_now = db_now
        self._mono = mono

    def now(self, mono: float, floor: datetime) -> datetime:
        """Database time at trio time ``mono``, not before ``floor``."""
        return max(self._db_now + timedelta(seconds=max(0.0, mono - self._mono)), floor)
