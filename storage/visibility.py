"""The one SQL readable predicate (docs/design.md#visibility).

Every read surface (history, resume, read-checks, and later search,
attachments, sources and thread root context) selects candidate rows aliased
``m`` from ``scope_messages`` and appends :data:`READABLE_JOIN`, which yields
``v.reason`` and ``v.grant_id`` per row (NULL reason = not readable). Its
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

from dataclasses import dataclass

from actors.model import Member

READABLE_JOIN = """
CROSS JOIN LATERAL (
    SELECT
        COALESCE(CASE
            WHEN %(viewer_public)s AND NOT %(in_thread)s THEN 'member'
            WHEN NOT %(viewer_private)s AND EXISTS (
                SELECT 1 FROM scopes ts
                JOIN scope_memberships pmm ON pmm.scope_id = ts.parent_scope_id
                WHERE ts.id = m.scope_id AND ts.type = 'thread'
                  AND pmm.member_id = %(viewer_id)s AND pmm.visibility = 'public'
                  AND pmm.effective_to_seq IS NULL
            ) THEN CASE WHEN %(viewer_public)s THEN 'member' ELSE 'parent_member' END
            WHEN NOT pm.covered THEN NULL
            WHEN m.author_member_id = %(viewer_id)s THEN 'own'
            WHEN m.author_member_id = %(owner_id)s THEN 'owner'
            WHEN g.id IS NOT NULL THEN 'grant'
            WHEN so.same_owner THEN 'same_owner_private'
        END, CASE
            WHEN %(viewer_private)s AND EXISTS (
                SELECT 1 FROM scope_message_sources cx
                WHERE cx.context_member_id = %(viewer_id)s AND cx.source_message_id = m.id
            ) THEN 'context'
        END) AS reason,
        CASE
            WHEN NOT %(viewer_public)s AND pm.covered
                 AND m.author_member_id <> %(viewer_id)s
                 AND m.author_member_id IS DISTINCT FROM %(owner_id)s
            THEN g.id
        END AS grant_id
    FROM (
        SELECT EXISTS (
            SELECT 1 FROM scope_memberships vm
            WHERE vm.scope_id = m.scope_id AND vm.member_id = %(viewer_id)s
              AND vm.visibility = 'private'
              AND vm.effective_from_seq <= m.seq
              AND (vm.effective_to_seq IS NULL OR m.seq < vm.effective_to_seq)
        ) AS covered
    ) pm
    LEFT JOIN LATERAL (
        SELECT gr.id FROM scope_private_grants gr
        WHERE gr.scope_id = ANY(%(grant_scopes)s)
          AND gr.owner_member_id = %(owner_id)s
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
              AND am.owner_member_id = %(owner_id)s
        ) AS same_owner
    ) so
) v
"""


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
