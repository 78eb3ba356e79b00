"""`include: ["reasoning.encrypted_content"]`: kvserve's own sealed copy of a reasoning
item's text, which a stateless client (`store: false`, Codex) sends back next turn so
that the model's past reasoning is rendered again (as the assistant turn's
`reasoning_content`, which templates that show past thinking read).

The blob is `kvs1.<key id>.<payload>.<mac>`: the payload (base64url JSON: the model and
the text) signed with HMAC-SHA256 under a secret drawn when the app starts. It is
signed, not encrypted: the same text is in the item's `content` already, in the clear.
The secret is this process's own, so a blob made by another replica or before a restart
(another key id), or by another server altogether (not `kvs1.`), is foreign: dropped
with a log line, the turn goes on without that reasoning. A blob with this process's key
id whose signature does not verify has been altered: 400 `invalid_encrypted_content`
naming the field, as OpenAI answers an invalid one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import secrets

from fastapi import Request

from server.errors import BadRequest

log = logging.getLogger("kvserve.server")
_PREFIX = "kvs1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ReasoningSeal:
    def __init__(self, secret: bytes):
        self._secret = secret
        self.key_id = hashlib.sha256(b"kvserve reasoning seal" + secret).hexdigest()[:16]

    def _mac(self, signed: str) -> str:
        return _b64(hmac.new(self._secret, signed.encode(), hashlib.sha256).digest())

    def seal(self, text: str, model: str) -> str:
        payload = _b64(json.dumps({"m": model, "r": text}, ensure_ascii=False).encode())
        signed = f"{_PREFIX}.{self.key_id}.{payload}"
        return f"{signed}.{self._mac(signed)}"

    def open(self, blob: object, model: str, param: str) -> str | None:
        """The reasoning text of a blob this process sealed for `model`; None for a
        foreign blob (logged); a 400 naming `param` for an altered one."""
        if not isinstance(blob, str):
            raise BadRequest(f"'{param}' must be a string", param=param)
        parts = blob.split(".")
        if len(parts) != 4 or parts[0] != _PREFIX or parts[1] != self.key_id:
            log.info("responses: dropped a reasoning item whose %s was not sealed by this "
                     "process (another replica, a restart, or another server)", param)  # fmt: skip
            return None
        signed = ".".join(parts[:3])
        if not hmac.compare_digest(self._mac(signed), parts[3]):
            raise BadRequest(f"'{param}' could not be verified: it was altered",
                             param=param, code="invalid_encrypted_content")  # fmt: skip
        try:
            payload = json.loads(_unb64(parts[2]))
            sealed_model, text = payload["m"], payload["r"]
        except (ValueError, binascii.Error, KeyError, TypeError):  # signed by us: cannot happen
            raise BadRequest(f"'{param}' could not be read", param=param,
                             code="invalid_encrypted_content") from None  # fmt: skip
        if sealed_model != model or not isinstance(text, str):
            log.info("responses: dropped a reasoning item of model %r (this turn runs %r)",
                     sealed_model, model)  # fmt: skip
            return None
        return text


def reasoning_seal(request: Request) -> ReasoningSeal:
    """The app's seal (made on first use, one per app: its secret lives as long as it)."""
    state = request.app.state
    seal = getattr(state, "reasoning_seal", None)
    if seal is None:
        seal = state.reasoning_seal = ReasoningSeal(secrets.token_bytes(32))
    return seal  # type: ignore[no-any-return]
