"""An offline Cloud Storage (JSON API v1) for tests: a real HTTP server that the real google-cloud-storage client talks to.

There is no official emulator, so this is a small faithful fake of the part ddctl_agents.storage uses: objects insert
(uploadType=media, multipart and resumable), get (metadata, or the bytes with alt=media, under /storage/v1 and
/download/storage/v1), list (prefix, pageToken, maxResults), delete, and buckets get. Objects live in memory with a
generation each; crc32c and md5 are computed like GCS's, sent in x-goog-hash, and checked when an upload carries them.
JSON is what Google sends: int64s as strings, base64 hashes, errors as {"error": {"code", "message", "errors": [...]}}.
fail() answers a method with an error status the way Google does; calls() is what the fake saw.

Pointing a client here (verified against google-cloud-storage 3.17, ``Client.__init__``): set
``STORAGE_EMULATOR_HOST=<endpoint>`` (scheme included). The client then uses that endpoint for both the API and the
upload/download hosts, AnonymousCredentials (no Authorization header) and no project.

What the library does that a test must know:
- Uploads of up to 8 MiB are one multipart POST; larger ones are resumable (a POST that opens a session, then PUTs of
  up to 100 MiB with Content-Range). Neither is retried without a generation precondition.
- ``bucket.get_blob()`` reads the metadata; the download that follows uses its mediaLink (generation included).
- Object names are percent-encoded in the path, "/" included (%2F).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import secrets
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import google_crc32c

from served import Served

_B = r"/b/(?P<bucket>[^/]+)"
_ROUTES = [(verb, re.compile(path + "$"), key) for verb, path, key in [
    ("POST", f"/upload/storage/v1{_B}/o", "objects.insert"), ("PUT", f"/upload/storage/v1{_B}/o", "objects.insert"),
    ("GET", f"/download/storage/v1{_B}/o/(?P<name>.+)", "objects.get"), ("GET", f"/storage/v1{_B}/o/(?P<name>.+)", "objects.get"),
    ("DELETE", f"/storage/v1{_B}/o/(?P<name>.+)", "objects.delete"), ("GET", f"/storage/v1{_B}/o", "objects.list"),
    ("GET", f"/storage/v1{_B}", "buckets.get"),
]]  # fmt: skip
_REASONS = {400: "invalid", 401: "required", 403: "forbidden", 404: "notFound", 412: "conditionNotMet",
            429: "rateLimitExceeded", 500: "backendError", 503: "backendError"}  # fmt: skip
Answer = tuple[int, dict[str, str], bytes]


@dataclass(frozen=True)
class Call:
    """One request as the fake saw it: the API method, bucket, object name, whether it returned bytes, its status."""

    method: str
    bucket: str
    name: str | None
    media: bool
    status: int


@dataclass
class _Object:
    data: bytes
    generation: int
    content_type: str


@dataclass
class _Session:
    bucket: str
    name: str
    content_type: str
    data: bytearray


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _hashes(data: bytes) -> dict[str, str]:
    crc = google_crc32c.value(data).to_bytes(4, "big")
    return {"crc32c": base64.b64encode(crc).decode(), "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode()}


class GcsFake(Served):
    """Cloud Storage on 127.0.0.1:<free port>; thread-safe. ``page_size`` caps a list page (GCS: 1000)."""

    thread_name = "gcs-fake"

    def __init__(self, *, page_size: int = 1000) -> None:
        self.page_size = page_size
        self._lock = threading.Lock()
        self._buckets: dict[str, dict[str, _Object]] = {}
        self._sessions: dict[str, _Session] = {}
        self._rules: list[tuple[str, int, int | None]] = []
        self._calls: list[Call] = []
        self._generations = itertools.count(1_700_000_000_000_000)

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _Handler

    # --- state, for tests -------------------------------------------------------------------------------------------

    def create_bucket(self, name: str) -> None:
        with self._lock:
            self._buckets.setdefault(name, {})

    def objects(self, bucket: str) -> dict[str, bytes]:
        with self._lock:
            return {name: obj.data for name, obj in self._buckets[bucket].items()}

    def fail(self, method: str, status: int, *, times: int | None = None) -> None:
        """Answer ``method`` (e.g. "objects.get") with ``status`` ``times`` times, or until reset()."""
        with self._lock:
            self._rules.append((method, status, times))

    def calls(self, method: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self._calls if method in (None, c.method)]

    def reset(self) -> None:
        with self._lock:
            self._buckets, self._sessions, self._rules, self._calls = {}, {}, [], []

    # --- the API ----------------------------------------------------------------------------------------------------

    def dispatch(self, verb: str, target: str, headers: dict[str, str], body: bytes) -> Answer:
        split = urlsplit(target)
        query = dict(parse_qsl(split.query))
        found = next(((key, m) for v, pattern, key in _ROUTES if v == verb and (m := pattern.match(split.path))), None)
        if found is None:
            return _error(404, f"the fake has no {verb} {split.path}")
        method, match = found
        bucket, name = match["bucket"], unquote(match.groupdict().get("name") or "") or None
        media = method == "objects.get" and query.get("alt") == "media"
        try:
            self._fault(method)
            answer: Answer = getattr(self, "_" + method.replace(".", "_"))(bucket, name, query, headers, body)
        except ApiError as exc:
            answer = _error(exc.status, exc.message)
        with self._lock:
            self._calls.append(Call(method, bucket, name, media, answer[0]))
        return answer

    def _fault(self, method: str) -> None:
        with self._lock:
            for i, (rule, status, times) in enumerate(self._rules):
                if rule == method:
                    if times == 1:
                        del self._rules[i]
                    elif times is not None:
                        self._rules[i] = (rule, status, times - 1)
                    raise ApiError(status, f"fault injected for {method}")

    def _bucket(self, bucket: str) -> dict[str, _Object]:
        if bucket not in self._buckets:
            raise ApiError(404, "The specified bucket does not exist.")
        return self._buckets[bucket]

    def _object(self, bucket: str, name: str | None, query: dict[str, str]) -> _Object:
        obj = self._bucket(bucket).get(name or "")
        if obj is None or ("generation" in query and int(query["generation"]) != obj.generation):
            raise ApiError(404, f"No such object: {bucket}/{name}")
        return obj

    def _resource(self, bucket: str, name: str, obj: _Object) -> dict[str, Any]:
        quoted = quote(name, safe="")
        return {
            "kind": "storage#object", "id": f"{bucket}/{name}/{obj.generation}", "name": name, "bucket": bucket,
            "selfLink": f"{self.endpoint}/storage/v1/b/{bucket}/o/{quoted}",
            "mediaLink": f"{self.endpoint}/download/storage/v1/b/{bucket}/o/{quoted}?generation={obj.generation}&alt=media",
            "generation": str(obj.generation), "metageneration": "1", "contentType": obj.content_type,
            "size": str(len(obj.data)), "storageClass": "STANDARD", "etag": f"CK{obj.generation}",
            "timeCreated": "2026-01-01T00:00:00.000Z", "updated": "2026-01-01T00:00:00.000Z", **_hashes(obj.data),
        }  # fmt: skip

    def _store(self, bucket: str, name: str, data: bytes, content_type: str, claimed: dict[str, str]) -> Answer:
        actual = _hashes(data)
        for field in ("crc32c", "md5Hash"):
            if field in claimed and claimed[field] != actual[field]:
                raise ApiError(400, f"Provided {field} {claimed[field]!r} doesn't match calculated {actual[field]!r}.")
        with self._lock:
            obj = self._bucket(bucket)[name] = _Object(data, next(self._generations), content_type)
        return _json(200, self._resource(bucket, name, obj))

    def _objects_insert(self, bucket: str, _: str | None, query: dict[str, str], headers: dict[str, str], body: bytes) -> Answer:
        kind = query.get("uploadType")
        with self._lock:
            self._bucket(bucket)
        if kind == "media":
            return self._store(bucket, query.get("name", ""), body, headers.get("content-type", ""), {})
        if kind == "multipart":
            meta, data, content_type = _multipart(headers.get("content-type", ""), body)
            return self._store(bucket, meta.get("name") or query.get("name", ""), data, content_type, meta)
        if kind == "resumable" and "upload_id" not in query:
            meta = json.loads(body or b"{}")
            upload = secrets.token_hex(8)
            content_type = headers.get("x-upload-content-type", "application/octet-stream")
            with self._lock:
                self._sessions[upload] = _Session(bucket, meta.get("name") or query.get("name", ""), content_type, bytearray())
            location = f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={upload}"
            return 200, {"Location": location}, b""
        if kind == "resumable":
            return self._chunk(query["upload_id"], headers, body)
        raise ApiError(400, f"uploadType {kind!r} is not supported by the fake")

    def _chunk(self, upload: str, headers: dict[str, str], body: bytes) -> Answer:
        """One PUT of a resumable session: ``Content-Range: bytes A-B/TOTAL`` (or ``*/TOTAL``, ``A-B/*``)."""
        match = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", headers.get("content-range", ""))
        with self._lock:
            session = self._sessions.get(upload)
        if session is None or match is None:
            raise ApiError(404 if session is None else 400, "no such upload session, or a bad Content-Range")
        if match[1] is not None:
            if int(match[1]) != len(session.data):
                raise ApiError(400, f"chunk starts at {match[1]}, the session holds {len(session.data)} bytes")
            session.data += body
        if match[3] != "*" and len(session.data) == int(match[3]):
            claimed = dict(h.split("=", 1) for h in headers.get("x-goog-hash", "").split(",") if "=" in h)
            answer = self._store(session.bucket, session.name, bytes(session.data), session.content_type, claimed)
            with self._lock:
                self._sessions.pop(upload, None)
            return answer
        return 308, ({"Range": f"bytes=0-{len(session.data) - 1}"} if session.data else {}), b""

    def _objects_get(self, bucket: str, name: str | None, query: dict[str, str], *_: Any) -> Answer:
        with self._lock:
            obj = self._object(bucket, name, query)
        if query.get("alt") != "media":
            return _json(200, self._resource(bucket, name or "", obj))
        hashes = _hashes(obj.data)
        return 200, {"Content-Type": obj.content_type, "x-goog-generation": str(obj.generation),
                     "x-goog-hash": f"crc32c={hashes['crc32c']},md5={hashes['md5Hash']}",
                     "x-goog-stored-content-length": str(len(obj.data))}, obj.data  # fmt: skip

    def _objects_delete(self, bucket: str, name: str | None, query: dict[str, str], *_: Any) -> Answer:
        with self._lock:
            self._object(bucket, name, query)
            del self._buckets[bucket][name or ""]
        return 204, {}, b""

    def _objects_list(self, bucket: str, _: str | None, query: dict[str, str], *__: Any) -> Answer:
        if "delimiter" in query:
            raise ApiError(400, "delimiter is not supported by the fake")
        prefix, after = query.get("prefix", ""), query.get("pageToken", "")
        size = min(int(query.get("maxResults", self.page_size)), self.page_size)
        with self._lock:
            found = sorted((n, o) for n, o in self._bucket(bucket).items() if n.startswith(prefix) and n > after)
        page: dict[str, Any] = {"kind": "storage#objects", "items": [self._resource(bucket, n, o) for n, o in found[:size]]}
        if len(found) > size:
            page["nextPageToken"] = found[size - 1][0]
        return _json(200, page)

    def _buckets_get(self, bucket: str, *_: Any) -> Answer:
        with self._lock:
            self._bucket(bucket)
        return _json(200, {"kind": "storage#bucket", "id": bucket, "name": bucket, "location": "US", "storageClass": "STANDARD"})


def _multipart(content_type: str, body: bytes) -> tuple[dict[str, Any], bytes, str]:
    """The (metadata, media, media content type) of a multipart/related upload body."""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/related") or boundary is None:
        raise ApiError(400, "a multipart upload needs Content-Type: multipart/related; boundary=...")
    parts = body.split(b"--" + boundary[1].encode())
    if len(parts) != 4 or parts[3].strip() != b"--":
        raise ApiError(400, "a multipart upload has exactly two parts: metadata and media")
    (meta_head, _, meta), (media_head, _, media) = (p.partition(b"\r\n\r\n") for p in parts[1:3])
    media_type = re.search(rb"content-type:\s*([^\r\n]+)", media_head, re.IGNORECASE)
    return json.loads(meta.removesuffix(b"\r\n")), media.removesuffix(b"\r\n"), media_type[1].decode() if media_type else ""


def _json(status: int, payload: dict[str, Any]) -> Answer:
    return status, {"Content-Type": "application/json; charset=UTF-8"}, json.dumps(payload).encode()


def _error(status: int, message: str) -> Answer:
    reason = _REASONS.get(status, "backendError")
    error = {"code": status, "message": message, "errors": [{"message": message, "domain": "global", "reason": reason}]}
    return _json(status, {"error": error})


class _Handler(BaseHTTPRequestHandler):
    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        headers = {k.lower(): v for k, v in self.headers.items()}
        fake: GcsFake = self.server.owner  # type: ignore[attr-defined]
        status, extra, data = fake.dispatch(self.command, self.path, headers, self.rfile.read(length))
        self.send_response(status)
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one stderr line per request drowns test output
