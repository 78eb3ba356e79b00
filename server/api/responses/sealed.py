"""`include: ["reasoning.encrypted_content"]`: kvserve's own sealed copy of a reasoning
item's text, which a stateless client (`store: false`, Codex) sends back next turn so
that the model's past reasoning is rendered again (as the assistant turn's
`reasoning_content`, which templates that show past thinking read).

The blob is `kvs1.<key id>.<payload>.<mac>`: the payload (base64url JSON: the model and
the text) signed with HMAC-SHA256 under the seal's secret. It is signed, not encrypted:
the same text is in the item's `content` already, in the clear. The secret, in order:
`[responses] seal_secret` (the same on every replica behind a load balancer); else a key
file in the disk cache's directory, made on first use (mode 0600), so a restarted server
reads its own blobs; else (no disk cache) one drawn for this process. A blob sealed under
another secret (another key id), or by another server altogether (not `kvs1.`), is
foreign: dropped with a log line, the turn goes on without that reasoning (and its
prompt differs from the last turn's from there, so the prefix cache misses from there).
A blob with our key id whose signature does not verify has been altered: 400
`invalid_encrypted_content` naming the field, as OpenAI answers an invalid one.
The secret is never logged; only where it came from.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile

from fastapi import Request

from server.config.tree import Settings
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
            log.info("responses: dropped a reasoning item whose %s was not sealed with this "
                     "server's secret (another [responses] seal_secret, or another server)",
                     param)  # fmt: skip
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


KEY_FILE = "reasoning-seal.key"  # in the disk cache's directory: 32 random bytes, hex


def _key_file_secret(directory: str) -> bytes:
    """The secret kept in `directory`/KEY_FILE, made on first use. Made under a temporary
    name and linked into place, so a file that exists is whole, and of two processes
    starting on one directory (replicas on a shared volume) both use the one that won."""
    path = os.path.join(directory, KEY_FILE)
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{KEY_FILE}.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: read theirs
        finally:
            os.unlink(tmp)
    if os.stat(path).st_mode & 0o077:
        log.warning("responses: %s can be read by other users; it should be mode 0600", path)
    with open(path) as f:
        secret = bytes.fromhex(f.read().strip())
    if len(secret) != 32:
        raise ValueError(f"{path} does not hold 32 bytes in hex")
    return secret


def seal_secret(settings: Settings) -> bytes:
    """The seal's secret (the module docstring's order); logs where it came from."""
    if settings.responses.seal_secret:
        log.info("responses: reasoning sealed with [responses] seal_secret")
        return settings.responses.seal_secret.encode()
    directory = settings.cache.disk_path if settings.cache.enabled else ""
    if directory:
        try:
            secret = _key_file_secret(directory)
        except (OSError, ValueError) as exc:
            log.warning("responses: the reasoning seal's key file is not usable (%s); "
                        "its blobs will be foreign after a restart", exc)  # fmt: skip
        else:
            log.info("responses: reasoning sealed with the key in %s",
                     os.path.join(directory, KEY_FILE))  # fmt: skip
            return secret
    log.info("responses: reasoning sealed with a key of this process (no disk cache, no "
             "[responses] seal_secret): its blobs are foreign after a restart and on other "
             "replicas")  # fmt: skip
    return secrets.token_bytes(32)


def reasoning_seal(request: Request) -> ReasoningSeal:
    """The app's seal, made on first use (one per app). The key file is read on the
    event loop then, once: a few bytes, as the rest of a request's work."""
    state = request.app.state
    seal = getattr(state, "reasoning_seal", None)
    if seal is None:
        seal = state.reasoning_seal = ReasoningSeal(seal_secret(state.settings))
    return seal  # type: ignore[no-any-return]
