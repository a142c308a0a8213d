"""A publisher for scope actors run without a node: it records what the actor
committed and tells no session anything."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from actors.planner import MessagePlan, MutationPlan
from actors.ports import CommittedMutation, CommittedSend, ReactionActivity, ThreadActivity


class RecordingPublisher:
    """The committed sends an actor handed over: their seqs in order, and each
    message's readers (the fan-out the plan decided)."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.readers: dict[str, frozenset[str]] = {}

    @contextmanager
    def batch(self) -> Iterator[None]:
        yield

    def publish_messages(
        self, scope_id: str, sends: Sequence[tuple[MessagePlan, CommittedSend]]
    ) -> None:
        for plan, commit in sends:
            self.seqs.append(commit.seq)
            self.readers[commit.message_id] = plan.readers

    def publish_membership(
        self, scope_id: str, member_id: str, op: str, visibility: str, audience: frozenset[str]
    ) -> None:
        pass

    def publish_thread(self, activity: ThreadActivity) -> None:
        pass

    def publish_mutation(self, plan: MutationPlan, commit: CommittedMutation) -> None:
        pass

    def publish_reaction(self, activity: ReactionActivity) -> None:
        pass
