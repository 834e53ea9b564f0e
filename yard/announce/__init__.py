"""Announcements: apps tell yard about work before they send it.

- ``service``: validation, the cap and clamp, storage, telling the core, the
  recurring ones; ``api``: ``/v1/announcements``; ``store``: the table in the
  jobs database; ``recurring``: ``[[announcements]]`` schedules (cron).

What the core does with them is in :mod:`yard.core.windows`.
"""

from yard.announce.service import AnnouncementNotFound, Announcements, BadAnnouncement, Limits

__all__ = ["AnnouncementNotFound", "Announcements", "BadAnnouncement", "Limits"]
