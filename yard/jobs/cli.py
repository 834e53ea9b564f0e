"""``yard jobs``: list, inspect, fetch and cancel the async jobs of a running yard.

It talks to yard's HTTP API (``/v1/jobs``) like any client:

    yard jobs list [--status queued,running] [--limit 20] [--json]
    yard jobs show ID [--wait SECONDS] [--json]
    yard jobs result ID [--output FILE] [--wait SECONDS]
    yard jobs cancel ID
    yard jobs delete-result ID

``--url`` (default ``$YARD_URL``, else ``--config``'s listen address, else
http://127.0.0.1:8080) says where yard listens; ``--key`` (default
``$YARD_API_KEY``, then ``$YARD_ADMIN_KEY``, then ``--config``'s admin key) is
an app's key (its own jobs) or the admin key (every job). From this machine,
while yard has no admin key, no key is needed to see every job (as for the
admin API). The options go anywhere: ``yard jobs list --key K`` works.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx

from yard import target
from yard.config import ConfigError

_KEY_ENVS = ("YARD_API_KEY", "YARD_ADMIN_KEY")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``yard jobs``."""
    target.add_target_arguments(
        parser,
        key_help="an app's API key (its jobs), or the admin key (every job); default: "
        "$YARD_API_KEY, $YARD_ADMIN_KEY, else server.admin_key of --config. From this "
        "machine no key is needed while yard has no admin key",
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="list jobs, newest first")
    listing.add_argument("--status", default="", help="comma-separated statuses to show")
    listing.add_argument("--limit", type=int, default=20, help="how many (1-100)")
    listing.add_argument("--after", default=None, help="continue after this job id")
    listing.add_argument("--json", action="store_true", help="print the raw JSON")
    show = sub.add_parser("show", help="one job: status, place in queue, why it waits")
    show.add_argument("id")
    show.add_argument("--wait", type=float, default=0.0, help="wait up to SECONDS for its end")
    show.add_argument("--json", action="store_true", help="print the raw JSON")
    result = sub.add_parser("result", help="the backend's answer, as it sent it")
    result.add_argument("id")
    result.add_argument(
        "--output", "-o", default=None, help="write the body here (default: stdout)"
    )
    result.add_argument("--wait", type=float, default=0.0, help="wait up to SECONDS for its end")
    cancel = sub.add_parser("cancel", help="cancel a queued or running job")
    cancel.add_argument("id")
    forget = sub.add_parser(
        "delete-result", help="delete an ended job's result (frees room in the app's job quota)"
    )
    forget.add_argument("id")


def run(args: argparse.Namespace) -> int:
    """Run ``yard jobs ACTION``; 0 on success, 1 on an error answer, 2 if yard
    cannot be reached."""
    try:
        found = target.resolve_target(args, key_envs=_KEY_ENVS)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return 2
    url = found.url if args.url or args.config else os.environ.get("YARD_URL", found.url)
    headers = {"authorization": f"Bearer {found.key}"} if found.key else {}
    wait = float(getattr(args, "wait", 0.0) or 0.0)
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=wait + 30.0) as client:
            return _run(client, args, wait)
    except httpx.HTTPError as exc:
        print(
            f"yard jobs: cannot reach yard at {url}: {exc} ({target.not_reached(found)})",
            file=sys.stderr,
        )
        return 2


def _run(client: httpx.Client, args: argparse.Namespace, wait: float) -> int:
    params: dict[str, str] = {"wait": str(wait)} if wait > 0 else {}
    if args.action == "list":
        params = {"limit": str(args.limit)}
        if args.status:
            params["status"] = args.status
        if args.after:
            params["after"] = args.after
        response = client.get("/v1/jobs", params=params)
        if response.status_code != 200:
            return _fail(response)
        data = response.json()
        if args.json:
            print(json.dumps(data, indent=2))
        else:
            print(format_table(data["data"]))
            if data.get("has_more"):
                print(f"(more: yard jobs list --after {data['last_id']})")
        return 0
    if args.action == "show":
        response = client.get(f"/v1/jobs/{args.id}", params=params)
        if response.status_code != 200:
            return _fail(response)
        job = response.json()
        print(json.dumps(job, indent=2) if args.json else format_job(job))
        return 0
    if args.action == "result":
        response = client.get(f"/v1/jobs/{args.id}/result", params=params)
        if response.status_code >= 400 and "x-yard-job-id" not in response.headers:
            return _fail(response)
        if args.output:
            with open(args.output, "wb") as f:
                f.write(response.content)
            print(
                f"HTTP {response.status_code}, {len(response.content)} bytes "
                f"({response.headers.get('content-type', 'no content type')}) -> {args.output}",
                file=sys.stderr,
            )
        else:
            sys.stdout.buffer.write(response.content)
            sys.stdout.flush()
        return 0 if response.status_code < 400 else 1
    if args.action == "delete-result":
        response = client.delete(f"/v1/jobs/{args.id}/result")
        if response.status_code != 200:
            return _fail(response)
        print(f"{args.id}: result deleted (the job {response.json()['status']})")
        return 0
    response = client.delete(f"/v1/jobs/{args.id}")
    if response.status_code != 200:
        return _fail(response)
    print(f"{args.id}: {response.json()['status']}")
    return 0


def _fail(response: httpx.Response) -> int:
    try:
        error = response.json()["error"]
        text = f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        text = response.text[:500]
    print(f"yard jobs: HTTP {response.status_code}: {text}", file=sys.stderr)
    return 1


def format_table(jobs: list[dict[str, Any]]) -> str:
    """Jobs as an aligned text table (id, app, model, status, created, place)."""
    rows = [("ID", "APP", "MODEL", "STATUS", "CREATED", "POSITION / ERROR")]
    for job in jobs:
        error = job.get("error") or {}
        where = (
            str(job["position"])
            if job.get("position") is not None
            else error.get("code", "") or ("result deleted" if job.get("result_gone") else "")
        )
        rows.append(
            (job["id"], job["app"], job["model"], job["status"], job["created_at"] or "", where)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def format_job(job: dict[str, Any]) -> str:
    """One job, for people."""
    lines = [f"{job['id']}  {job['status']}  ({job['app']} -> {job['model']})"]
    for key in ("created_at", "started_at", "finished_at", "expires_at", "deadline"):
        if job.get(key):
            lines.append(f"  {key}: {job[key]}")
    lines.append(f"  priority: {job['priority']}")
    if job.get("position") is not None:
        lines.append(
            f"  queue: position {job['position']}, effective priority "
            f"{job['effective_priority']}, estimated start {job.get('estimated_start') or '?'}"
        )
        lines.append(f"  waiting because: {job['reason']}")
    if job.get("error"):
        lines.append(f"  error: {job['error']['code']}: {job['error']['message']}")
    if job.get("result"):
        result = job["result"]
        lines.append(
            f"  result: HTTP {result['status']}, {result['bytes']} bytes, "
            f"{result['content_type'] or 'no content type'} ({result['url']})"
        )
    if job.get("result_gone"):
        lines.append(f"  result: {job['result_gone']}")
    return "\n".join(lines)
