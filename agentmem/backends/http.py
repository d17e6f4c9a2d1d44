"""JSON over HTTP to an OpenAI-compatible server, with the standard library only (urllib): a POST (or a GET
with no body) whose answer is JSON, and one error type that carries the HTTP status and the server's own
message (its ``error.message`` when the body is OpenAI's error shape)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request


class HttpError(Exception):
    """``status`` is the HTTP status, or None when the server could not be reached."""

    def __init__(self, status: int | None, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def request_json(url: str, body: dict | None, api_key: str | None, timeout_s: float) -> dict:
    """POST ``body`` as JSON (GET when it is None) and return the decoded answer. Raises HttpError."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                    timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")
        try:
            detail = json.loads(detail)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        raise HttpError(err.code, detail) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as err:
        # HTTPException: the server closed the connection in the middle of its answer (it died mid-call)
        raise HttpError(None, str(err)) from None
