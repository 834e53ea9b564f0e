"""A small fake of the engine's shape (submit / Admission) for the proxy tests.

It dispatches at once to the backend's URL, unless told to hold a backend's
requests (``hold``), to reject them (``reject``), or to requeue once after an
``upstream_lost`` report (``requeue_lost``). It records every submit, report
and cancel, so a test can check what the proxy told the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import trio

from yard.engine import Assignment
from yard.errors import Rejected


@dataclass
class FakeAdmission:
    engine: FakeEngine
    request_id: str
    backend: str
    submitted: dict[str, Any]
    queued_s: float = 0.0
    reports: list[tuple[str, str]] = field(default_factory=list)
    cancelled: bool = False
    dispatches: int = 0
    # Never dispatched inside submit: the gateway always waits.
    assignment: Assignment | None = None

    async def wait_dispatched(self) -> Assignment:
        await trio.lowlevel.checkpoint()
        engine = self.engine
        lost = bool(self.reports) and self.reports[-1][0] == "upstream_lost"
        if lost and (not engine.requeue_lost or self.dispatches > 1):
            raise Rejected(status=502, code="backend_failed", message="the backend failed")
        rejected = engine.reject.get(self.backend)
        if rejected is not None:
            raise rejected
        gate = engine.hold.get(self.backend)
        if gate is not None:
            await gate.wait()
        self.dispatches += 1
        self.queued_s = 0.0125
        return Assignment(
            request_id=self.request_id,
            backend=self.backend,
            base_url=engine.base_urls[self.backend],
        )

    def report(self, outcome: str = "ok", detail: str = "") -> None:
        self.reports.append((outcome, detail))
        self.engine.changed.set()

    def cancel(self) -> None:
        if not self.reports or self.reports[-1][0] == "upstream_lost":
            self.cancelled = True
            self.engine.changed.set()


@dataclass
class FakeEngine:
    base_urls: dict[str, str]
    hold: dict[str, trio.Event] = field(default_factory=dict)
    reject: dict[str, Rejected] = field(default_factory=dict)
    requeue_lost: bool = False
    admissions: list[FakeAdmission] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    def now(self) -> float:
        return trio.current_time()

    def submit(self, **kwargs: Any) -> FakeAdmission:
        admission = FakeAdmission(
            engine=self,
            request_id=kwargs["request_id"],
            backend=kwargs["backend"],
            submitted=kwargs,
        )
        self.admissions.append(admission)
        self.changed.set()
        return admission

    def snapshot(self, limit: int = 200) -> Any:
        backends = [
            SimpleNamespace(name=name, state="ready", context=None, parallel=None)
            for name in self.base_urls
        ]
        return SimpleNamespace(backends=backends)

    async def wait_submitted(self, count: int) -> None:
        """Wait until ``count`` requests were submitted."""
        while len(self.admissions) < count:
            self.changed = trio.Event()
            await self.changed.wait()

    async def wait_settled(self, admission: FakeAdmission) -> None:
        """Wait until the admission was reported finished or cancelled."""
        while not (admission.cancelled or admission.reports):
            self.changed = trio.Event()
            await self.changed.wait()
