"""The one SQL readable predicate (docs/design.md#visibility).

Every read surface (history, resume, read checks, search, reactions, the
relay, attachments, sources and thread root context) selects candidate rows
aliased ``m`` from ``scope_messages`` and appends the text of
:func:`readable_join`, which yields ``v.reason`` and ``v.grant_id`` per row
(NULL reason = not readable). It is the only text of the predicate: a
statement that decides for many viewers or scopes at once passes the columns
that carry the inputs (:class:`ViewerTerms`), never an edited copy. Its
in-memory twin is ``actors/visibility.py``; a property test proves they agree.

Parameters: ``viewer_id``, ``viewer_public`` (the viewer is not a private agent
and holds a current membership of the scope), ``viewer_private`` (the viewer is
a private agent), ``owner_id`` (the viewer's owner when it is a private agent,
else NULL), ``grant_scopes`` (the scope and, for a thread, its parent),
``in_thread`` (the scope is a reply thread).

In a thread, a viewer that is not a private agent reads only while it holds a
current public membership of the parent, and then reads every message (reason
``member`` with a current thread membership, else ``parent_member``:
computed here, never materialised as rows). A thread membership alone
grants nothing, so a member who left the parent stops reading its threads.
The constant guards let the planner drop that lookup for channel members and
for private agents.

A private agent also reads, by reason ``context``, exactly the messages an
explicit-context send addressed to it opened (its ``recipient_context`` rows
in ``scope_message_sources``, docs/design.md#sources), wherever they are and
whether or not it is a member there; every other reason comes first.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from actors.model import Member


@dataclass(frozen=True, slots=True)
class ViewerTerms:
    """The viewer's inputs to the predicate, each a SQL expression.

    By default the statement's parameters; a statement that decides for many
    viewers (or many scopes) at once names the columns that carry them per row
    instead, and the predicate's text stays the one below.
    """

    viewer_id: str = "%(viewer_id)s"
    viewer_public: str = "%(viewer_public)s"
    viewer_private: str = "%(viewer_private)s"
    owner_id: str = "%(owner_id)s"
    grant_scopes: str = "%(grant_scopes)s"
    in_thread: str = "%(in_thread)s"

    @classmethod
    def columns_of(cls, alias: str) -> ViewerTerms:
        """Every input from the same-named column of ``alias``."""
        return cls(*(f"{alias}.{field.name}" for field in fields(cls)))


# The inputs as the statement's parameters (one viewer in one scope).
BOUND = ViewerTerms()


def readable_join(i: ViewerTerms = BOUND) -> str:
    """The readable predicate for candidate rows aliased ``m``: a lateral join
    yielding ``v.reason`` (NULL: not readable) and ``v.grant_id``."""
    return f"""
CROSS JOIN LATERAL (
    SELECT
        COALESCE(CASE
            WHEN {i.viewer_public} AND NOT {i.in_thread} THEN 'member'
            WHEN NOT {i.viewer_private} AND EXISTS (
                SELECT 1 FROM scopes ts
                JOIN scope_memberships pmm ON pmm.scope_id = ts.parent_scope_id
                WHERE ts.id = m.scope_id AND ts.type = 'thread'
                  AND pmm.member_id = {i.viewer_id} AND pmm.visibility = 'public'
                  AND pmm.effective_to_seq IS NULL
            ) THEN CASE WHEN {i.viewer_public} THEN 'member' ELSE 'parent_member' END
            WHEN NOT pm.covered THEN NULL
            WHEN m.author_member_id = {i.viewer_id} THEN 'own'
            WHEN m.author_member_id = {i.owner_id} THEN 'owner'
            WHEN g.id IS NOT NULL THEN 'grant'
            WHEN so.same_owner THEN 'same_owner_private'
        END, CASE
            WHEN {i.viewer_private} AND EXISTS (
                SELECT 1 FROM scope_message_sources cx
                WHERE cx.context_member_id = {i.viewer_id} AND cx.source_message_id = m.id
            ) THEN 'context'
        END) AS reason,
        CASE
            WHEN NOT {i.viewer_public} AND pm.covered
                 AND m.author_member_id <> {i.viewer_id}
                 AND m.author_member_id IS DISTINCT FROM {i.owner_id}
            THEN g.id
        END AS grant_id
    FROM (
        SELECT EXISTS (
            SELECT 1 FROM scope_memberships vm
            WHERE vm.scope_id = m.scope_id AND vm.member_id = {i.viewer_id}
              AND vm.visibility = 'private'
              AND vm.effective_from_seq <= m.seq
              AND (vm.effective_to_seq IS NULL OR m.seq < vm.effective_to_seq)
        ) AS covered
    ) pm
    LEFT JOIN LATERAL (
        SELECT gr.id FROM scope_private_grants gr
        WHERE gr.scope_id = ANY({i.grant_scopes})
          AND gr.owner_member_id = {i.owner_id}
          AND gr.grantee_member_id = m.author_member_id
          AND gr.created_at <= m.created_at
          AND (least(gr.revoked_at, gr.expires_at) IS NULL
               OR m.created_at < least(gr.revoked_at, gr.expires_at))
        ORDER BY gr.created_at, gr.id COLLATE "C"
        LIMIT 1
    ) g ON true
    CROSS JOIN LATERAL (
        SELECT EXISTS (
            SELECT 1 FROM members am
            JOIN scope_memberships amm
              ON amm.member_id = am.id AND amm.scope_id = m.scope_id
             AND amm.visibility = 'private'
             AND amm.effective_from_seq <= m.seq
             AND (amm.effective_to_seq IS NULL OR m.seq < amm.effective_to_seq)
            WHERE am.id = m.author_member_id AND am.is_private AND am.type = 'agent'
              AND am.owner_member_id = {i.owner_id}
        ) AS same_owner
    ) so
) v
"""


READABLE_JOIN = readable_join(BOUND)


def scope_shape(scope: str) -> str:
    """The predicate's scope inputs read from the ``scopes`` row ``scope``, as
    the columns ``in_thread`` and ``grant_scopes`` (the scope and, for a
    thread, its parent), for statements that decide in many scopes at once."""
    return f"""{scope}.type = 'thread' AS in_thread,
        CASE WHEN {scope}.parent_scope_id IS NULL THEN ARRAY[{scope}.id]
             ELSE ARRAY[{scope}.id, {scope}.parent_scope_id] END AS grant_scopes"""


@dataclass(frozen=True, slots=True)
class Viewer:
    member: Member
    public_reader: bool
    grant_scopes: tuple[str, ...]
    # The scope is a reply thread: a current thread membership reads only
    # together with a current public membership of the parent.
    in_thread: bool = False

    def params(self) -> dict[str, object]:
        return {
            "in_thread": self.in_thread,
            "viewer_id": self.member.id,
            "viewer_public": self.public_reader,
            "viewer_private": self.member.is_private_agent,
            "owner_id": self.member.owner_member_id if self.member.is_private_agent else None,
            "grant_scopes": list(self.grant_scopes),
        }
