"""App weights (``[apps.NAME] weight``): a bounded fairness term among apps.

Rules it keeps
--------------

- Off unless some app has a weight. Off, every rank is the one of
  :mod:`yard.core.queue` and the core decides exactly as without this module.
- On, it is start-time fair queuing on the GPU time apps ask for. Each app has a
  finish tag ``F`` and the core a virtual time ``V`` (both in seconds of service
  divided by a weight): ``V`` is the largest start tag of any request dispatched
  so far, and every app's finish tag when a request enters an empty queue
  (nobody was kept waiting by an app's lead). A request of app ``a`` that
  arrives gets the start tag
  ``S = max(V, F[a])``, and ``F[a]`` becomes ``S + cost / weight[a]``, ``cost``
  being its backend's expected service time. ``S - V`` is how far the app is
  ahead of its share: the service it asked for and was not yet given, divided
  by its weight. Apps without a weight count with weight 1.
- The term: the request ranks ``min(share_points, aging_rate * (S - V))``
  points lower, fixed at its arrival, as if it had arrived that many seconds
  of aging later. An app that keeps within its share loses nothing; an app
  that floods the queue loses at most ``share_points`` on each request, so
  among requests within that band of each other the app further ahead of its
  share goes later, and outside it priority and aging decide as before.
- Because the term is fixed at arrival, a waiting request's rank never changes,
  the queues stay heaps, and the wait bound's ``T`` grows by
  ``share_points / aging_rate`` (``docs/wait-bound.md``).
- Each arrival and each dispatch costs O(1); an arrival into an empty queue
  O(apps).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class Shares:
    """The virtual clocks of the fairness term (see the module docstring).

    weights: per app, its weight (> 0); apps not in it have weight 1.
    points: the most priority points the term takes from one request.
    aging_rate: priority points per second of waiting (turns a lead in
        seconds into points).
    """

    weights: Mapping[str, float]
    points: float
    aging_rate: float
    virtual: float = 0.0
    _finish: dict[str, float] = field(default_factory=dict)

    def arrive(self, app: str, cost_s: float, *, alone: bool) -> tuple[float, float]:
        """Tag a request of ``app`` that enters the queue, expected to hold a slot
        for ``cost_s``: returns its start tag and the points it ranks lower.

        alone: no other request waits. Nobody was kept waiting by any app's
        lead, so virtual time first catches up with every app (O(apps)).
        """
        if alone and self._finish:
            self.virtual = max(self.virtual, *self._finish.values())
        start = max(self.virtual, self._finish.get(app, 0.0))
        self._finish[app] = start + cost_s / self.weights.get(app, 1.0)
        return start, min(self.points, self.aging_rate * (start - self.virtual))

    def dispatched(self, tag: float) -> None:
        """A request with start tag ``tag`` was dispatched: virtual time moves on."""
        if tag > self.virtual:
            self.virtual = tag

    def weight(self, app: str) -> float:
        """``app``'s weight (1 where it has none)."""
        return self.weights.get(app, 1.0)

    def lead_s(self, app: str) -> float:
        """How far ``app`` is ahead of its share now, in its weighted seconds."""
        return max(0.0, self._finish.get(app, 0.0) - self.virtual)
