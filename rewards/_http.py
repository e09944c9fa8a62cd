"""JSON POSTs of the rewards that score over HTTP (``remote``, ``vlm_judge``), with bounded retries.

Both read a reply the same way: the transport's exceptions, a server's HTTP error, a body that is not
JSON or not an object, each sorted into transient (retried) or final. What differs is the request and
the words (which server, which option fixes it), so a subclass supplies those.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any, ClassVar

from vgrpo_platform.errors import RewardError
from vgrpo_platform.retrying import TransientError, with_retries


class JsonPoster:
    """``_post(body)``: the subclass's ``_request`` sent until it succeeds or ``config.retries`` run out.

    The subclass sets ``config`` (``timeout_s``, ``retries``, ``backoff_s``), ``server`` and ``replier``
    and the fixes below, and words a server's HTTP errors in ``_http_error``; every message names its fix.
    """

    config: Any
    error_prefix: ClassVar[str] = ""
    """Put before the transport errors, e.g. ``"vlm_judge: "``."""
    server: str
    """The server in transport errors, e.g. ``"the reward server at URL"``."""
    replier: str
    """Who sent a malformed reply (often ``server``)."""
    not_json_fix: ClassVar[str]
    """The fix appended to the error for a reply that is not JSON."""
    timeout_fix: ClassVar[str]
    """The fix appended to the error for no reply within ``config.timeout_s``."""
    unreachable_fix: ClassVar[str]
    """The fix appended to the error for a server that cannot be reached."""

    def _request(self, body: Any) -> urllib.request.Request:
        """The request that sends ``body``, what ``_post`` was given (JSON bytes, or ``remote``'s frame)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _request()")

    def _http_error(self, code: int, body: bytes) -> Exception:
        """The ``TransientError`` or ``RewardError`` for a server's HTTP error ``code`` with ``body``."""
        raise NotImplementedError(f"{type(self).__name__} must implement _http_error()")

    def _post(self, body: Any) -> dict[str, Any]:
        """One POST with up to ``retries`` more tries on transient failures, backing off between them."""
        return with_retries(
            lambda: self._post_once(body), retries=self.config.retries, backoff_s=self.config.backoff_s
        )

    def _post_once(self, body: Any) -> dict[str, Any]:
        request = self._request(body)
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc.code, exc.read()) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # timeouts are OSErrors
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise TransientError(
                    f"{self.error_prefix}no reply from {self.server} within {self.config.timeout_s:g} s; "
                    f"{self.timeout_fix}"
                ) from None
            raise TransientError(
                f"{self.error_prefix}cannot reach {self.server} ({reason}); {self.unreachable_fix}"
            ) from None
        try:
            reply = json.loads(text)
        except ValueError:
            raise RewardError(
                f"malformed reply from {self.replier}: not JSON ({text[:60]!r}); {self.not_json_fix}"
            ) from None
        if not isinstance(reply, dict):
            raise RewardError(f"malformed reply from {self.replier}: not a JSON object")
        return reply
