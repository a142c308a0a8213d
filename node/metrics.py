"""Counters and gauges rendered in the Prometheus text format (R-30)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable


class Metrics:
    def __init__(self) -> None:
        self.send_states: Counter[str] = Counter()
        self.compat_sends = 0
        self.sessions_opened = 0
        self.sessions_closed: Counter[int] = Counter()
        self.frames_in = 0
        self.errors: Counter[str] = Counter()
        self.gauges: dict[str, Callable[[], float]] = {}
        self.outbox_states: dict[str, int] = {}

    def set_outbox_states(self, counts: dict[str, int]) -> None:
        self.outbox_states = dict(counts)

    def on_send(self, state: str, compat: bool) -> None:
        self.send_states[state] += 1
        if compat:
            self.compat_sends += 1

    def render(self) -> str:
        lines = [
            "# HELP scopenode_sends_total Send results by state.",
            "# TYPE scopenode_sends_total counter",
        ]
        lines.extend(
            f'scopenode_sends_total{{state="{state}"}} {self.send_states[state]}'
            for state in ("sent", "already_sent", "held", "partial_held")
        )
        total = sum(self.send_states.values())
        held = self.send_states["held"] + self.send_states["partial_held"]
        lines += [
            "# TYPE scopenode_held_ratio gauge",
            f"scopenode_held_ratio {held / total if total else 0.0}",
            "# TYPE scopenode_compat_sends_total counter",
            f"scopenode_compat_sends_total {self.compat_sends}",
            "# TYPE scopenode_sessions_opened_total counter",
            f"scopenode_sessions_opened_total {self.sessions_opened}",
            "# TYPE scopenode_sessions_closed_total counter",
        ]
        lines.extend(
            f'scopenode_sessions_closed_total{{code="{code}"}} {count}'
            for code, count in sorted(self.sessions_closed.items())
        )
        lines.append("# TYPE scopenode_errors_total counter")
        lines.extend(
            f'scopenode_errors_total{{code="{name}"}} {count}'
            for name, count in sorted(self.errors.items())
        )
        lines.append("# TYPE scopenode_outbox_rows gauge")
        lines.extend(
            f'scopenode_outbox_rows{{status="{status}"}} {self.outbox_states.get(status, 0)}'
            for status in ("pending", "leased", "delivered", "failed", "suppressed")
        )
        for name, read in sorted(self.gauges.items()):
            lines += [f"# TYPE scopenode_{name} gauge", f"scopenode_{name} {read()}"]
        return "\n".join(lines) + "\n"
