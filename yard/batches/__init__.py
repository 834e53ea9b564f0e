"""The OpenAI Batch API on top of durable jobs: ``/v1/files`` and ``/v1/batches``.

Layout:

- ``schema``: the tables (in the job database, ``data_dir/jobs.sqlite``, so
  that a line and the job it becomes are written in one transaction);
- ``records``: a file, a batch and a batch line as stored; ``validate``: the
  input file checked line by line, with OpenAI's error codes (pure);
- ``store``: files, batches and lines over the job store's database (SQLite,
  or a cluster's PostgreSQL, where :class:`yard.cluster.batches.ClusterBatchStore`
  adds the driving node); ``rows``: the column lists and their rows as
  records; ``service``:
  :class:`~yard.batches.service.Batches`, which takes files and batches,
  cancels, and keeps a driver running for every batch that has not ended;
  ``driver``: :class:`~yard.batches.driver.BatchDriver`, which validates a
  batch, turns its lines into jobs, watches them end and writes the output
  and error files; ``views``: the JSON shapes;
- ``api``: the Quart blueprints and the router that sends ``/v1/files`` and
  ``/v1/batches`` to them.

This module imports nothing, so that the job store can take the schema.
"""
