"""yard's own HTTP API as an OpenAPI 3.1 document, served at ``GET /openapi.json``.

What it covers, and how far:

- yard's own routes in full: ``/healthz``, the jobs API (``/v1/jobs``),
  ``/v1/models``, the admin API (``/admin/...``), ``/metrics``, the dashboard
  and this document; every JSON answer has a schema (objects stay open to
  new fields, so that adding one is not a breaking change);
- the routes yard proxies (the OpenAI-compatible ``/v1/*`` and
  ``/backends/NAME/PATH``) by their contract only: what yard reads (the
  ``model`` field, the ``X-Yard-*`` headers, ``Prefer: respond-async``) and
  yard's own answers (202 for a job, the error shape and its codes). The
  backend's answer passes through unchanged, so its schema is the backend's.

``tests/http/test_openapi.py`` keeps the document true: every route the
control plane and the gateway serve is here and every path here is served,
answers of a running yard validate against it, and a schemathesis run over it
gets no 500.

Modules, by section: ``common`` (the error shape and its codes, the answers
of the HTTP server and guard before any route, builders), ``proxied`` (the
OpenAI-compatible routes and ``/backends/...``), ``jobs``, ``batches`` (files
and batches), ``announcements``, ``admin`` (the admin API and the dashboard),
and ``document`` (the service routes, :func:`document` that puts the sections
together, and :func:`register` that serves it).
"""

from yard.app.openapi.common import ERROR_CODES, Schema
from yard.app.openapi.document import document, register
from yard.app.openapi.proxied import OPENAI_ROUTES, PROXY_METHODS

__all__ = ["ERROR_CODES", "OPENAI_ROUTES", "PROXY_METHODS", "Schema", "document", "register"]
