"""Resolve an hf:// revision (a branch or tag; default: the default branch) to a commit, once per ScoringModel.

The commit goes to status.model.resolvedRevision and into the pod template, so every replica, every restart and
every rollout downloads the same files until the spec names another revision. One GET of the Hub's model API
(`/api/models/<repo>/revision/<revision>`, whose `sha` is the commit) against `SCOREKEEPER_HF_ENDPOINT`; stdlib
urllib, so HTTPS_PROXY / NO_PROXY apply. A revision written as a 40-hex commit never gets here.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from urllib.parse import quote

from scorekeeper_operator.k8s import TransientApiError
from scorekeeper_operator.spec.model import COMMIT
from scorekeeper_operator.spec.settings import OperatorSettings


class HubUnavailable(TransientApiError):
    """The Hub did not answer (connection, timeout, 429, 5xx): retried with the usual backoff."""


class Unresolvable(Exception):
    """The Hub answered, and the answer will not change by retrying: becomes ConfigValid=False."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def revision_url(endpoint: str, repo: str, revision: str | None) -> str:
    base = f"{endpoint.rstrip('/')}/api/models/{repo}"
    return f"{base}/revision/{quote(revision, safe='')}" if revision else base


def _get(url: str, token: str | None, timeout: float) -> tuple[int, bytes]:
    headers = {"Accept": "application/json", "User-Agent": "scorekeeper-operator"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


async def resolve_revision(settings: OperatorSettings, repo: str, revision: str | None) -> str:
    """The commit `revision` of `repo` points to now. Raises HubUnavailable or Unresolvable."""
    url = revision_url(settings.hf_endpoint, repo, revision)
    what = f"{repo}@{revision or 'default branch'}"
    try:
        status, body = await asyncio.to_thread(_get, url, settings.hf_token, settings.request_timeout_seconds)
    except (OSError, ValueError) as error:  # URLError, timeouts, refused connections, a malformed endpoint
        raise HubUnavailable(0, type(error).__name__, f"resolving {what} at {url}: {error}") from error
    if status in (401, 403, 404):
        # The Hub answers 401 for private, gated and missing repositories alike when no valid token is sent.
        hint = ("" if status == 404 else "; a private or gated repository needs the operator's Hub token"
                " (SCOREKEEPER_HF_TOKEN), or pin model.revision to a 40-hex commit")
        raise Unresolvable("RevisionNotFound" if status == 404 else "HubAccessDenied",
                           f"{settings.hf_endpoint} answered HTTP {status} for {what}{hint}")
    if status != 200:
        raise HubUnavailable(status, "HubError", f"{url} answered HTTP {status}: {body[:200]!r}")
    try:
        commit = json.loads(body).get("sha")
    except (ValueError, AttributeError):
        commit = None
    if not isinstance(commit, str) or not COMMIT.match(commit):
        raise HubUnavailable(status, "HubError", f"{url} answered without a commit sha: {body[:200]!r}")
    return commit
