"""Announcements: apps tell yard about work before they send it.

- ``service``: validation, the cap and clamp, storage, telling the core, the
  recurring ones; ``api``: ``/v1/announcements``; ``store``: the table in the
  jobs database; ``recurring``: ``[[announcements]]`` schedules (cron), read
  by the configuration too (so this package re-exports nothing: importing
  ``yard.config.announcements`` must not pull in the HTTP side).

What the core does with them is in :mod:`yard.core.windows`.
"""
