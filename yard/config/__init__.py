"""The configuration: one TOML file, validated completely before anything starts.

Rules this package keeps:

- Every error is collected, not only the first; each names the file, the key
  path and what is wrong, and where possible what to do
  (``"yard.toml: backends.llm.slots: must be at least 1, got 0"``).
- Unknown keys are errors (a typo must not silently fall back to a default),
  with the nearest known key suggested.
- Secrets may come from the environment (``key_env``, ``admin_key_env``); a
  variable that is named but not set is an error that names it.
- With no app keys and no admin key, yard listens on loopback only: anybody on
  the network could otherwise use the GPU. With an admin key but no app keys
  too, unless ``server.allow_anonymous = true`` says the open data plane is
  meant (:func:`exposure` says who may use what).
- Paths in the file are relative to the file's own directory.

The loaded :class:`Config` is plain frozen data; :meth:`Config.backend_specs`
and :meth:`Config.device_specs` turn it into the records the core takes.

``yard check FILE`` (:func:`add_arguments` / :func:`run`) validates a file
without starting anything.

Modules, by section: ``reading`` (:class:`ConfigError`, the reader, sizes, paths,
placeholders), ``server``, ``apps``, ``jobs``, ``backends`` (devices too),
``loader`` (:class:`Config`, ``[scheduler]``, :func:`load_config`) and ``check``
(``yard check``, :func:`exposure`).
"""

from yard.config.apps import APP_KEYS, LOCAL_APP, AppConfig, key_digest
from yard.config.backends import (
    BACKEND_KEYS,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEVICE_KEYS,
    WARMUP_KEYS,
    BackendConfig,
    DeviceConfig,
    FillContext,
    WarmupConfig,
)
from yard.config.check import add_arguments, exposure, run, summary, warnings
from yard.config.jobs import JOBS_KEYS, JobsConfig
from yard.config.loader import (
    SCHEDULER_KEYS,
    TOP_KEYS,
    Config,
    default_config,
    is_loopback,
    load_config,
    local_app,
)
from yard.config.reading import (
    LOG_LEVELS,
    PATH_PLACEHOLDERS,
    PLACEHOLDERS,
    ConfigError,
    parse_listen,
    parse_size,
)
from yard.config.server import SERVER_KEYS, ServerConfig

__all__ = [
    "APP_KEYS",
    "BACKEND_KEYS",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DEVICE_KEYS",
    "JOBS_KEYS",
    "LOCAL_APP",
    "LOG_LEVELS",
    "PATH_PLACEHOLDERS",
    "PLACEHOLDERS",
    "SCHEDULER_KEYS",
    "SERVER_KEYS",
    "TOP_KEYS",
    "WARMUP_KEYS",
    "AppConfig",
    "BackendConfig",
    "Config",
    "ConfigError",
    "DeviceConfig",
    "FillContext",
    "JobsConfig",
    "ServerConfig",
    "WarmupConfig",
    "add_arguments",
    "default_config",
    "exposure",
    "is_loopback",
    "key_digest",
    "load_config",
    "local_app",
    "parse_listen",
    "parse_size",
    "run",
    "summary",
    "warnings",
]
