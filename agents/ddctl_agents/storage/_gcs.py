"""Google Cloud Storage through google-cloud-storage, imported only when a gs:// URL is used.

With ``STORAGE_EMULATOR_HOST`` set (scheme included, e.g. ``http://127.0.0.1:9023``) the client itself
talks to that endpoint with anonymous credentials (google-cloud-storage 3.x, ``Client.__init__``), so
nothing here special-cases it. Otherwise credentials come from Application Default Credentials. The
client is made with no project: reading and writing objects needs none, and inferring one can fail.
Every call, uploads included (google-cloud-storage 3.x), retries 408, 429, 5xx and dropped connections
with backoff for ``RETRY_S``. A 404 does not say whether the bucket or the object is missing, so the
bucket is asked for before answering.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from ddctl_agents.storage._location import Location, StorageError, directory, render

RETRY_S = 120.0
"""How long one call keeps retrying transient failures before it is reported unreachable (the library's default)."""
_ENV_PREFIXES = ("GOOGLE_", "CLOUDSDK_", "STORAGE_EMULATOR_HOST", "API_ENDPOINT_OVERRIDE")
_lock = threading.Lock()
_client: tuple[tuple[tuple[str, str], ...], Any] | None = None


def _gcs() -> Any:
    """The cached client, remade when the environment that configures it changed."""
    global _client
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)))
    with _lock:
        if _client is None or _client[0] != env:
            from google.cloud import storage  # lazily: most commands never touch GCS

            if _client is not None:
                with contextlib.suppress(Exception):
                    _client[1].close()  # its pooled connections, now
            _client = (env, storage.Client(project=None))
        return _client[1]


def _retry() -> Any:
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_timeout(RETRY_S)


def _missing(loc: Location) -> StorageError:
    """The bucket or the object, after asking for the bucket (a failed question blames the object)."""
    try:
        there = bool(_gcs().bucket(loc.bucket).exists(retry=_retry()))
    except Exception:
        there = True
    return StorageError(loc.url, "no such object", kind="missing") if there else _no_bucket(loc)


def _no_bucket(loc: Location) -> StorageError:
    return StorageError(loc.url, f"no such bucket {loc.bucket!r}", kind="no_bucket")


@contextlib.contextmanager
def _errors(loc: Location, *, listing: bool = False) -> Iterator[None]:
    """The library's errors → StorageError with a short reason; the only place that knows them."""
    from google.api_core import exceptions as gx
    from google.auth import exceptions as ax
    from google.cloud.storage import exceptions as sx
    from requests import exceptions as rx

    try:
        yield
    except gx.NotFound:
        raise (_no_bucket(loc) if listing else _missing(loc)) from None
    except (gx.Forbidden, gx.Unauthorized) as exc:
        raise StorageError(loc.url, f"access denied ({exc.code}: {_said(exc)})", kind="denied") from None
    except gx.RetryError as exc:
        reason = f"GCS unreachable or unavailable, gave up retrying after {RETRY_S:g} s{_cause(exc.cause)}"
        raise StorageError(loc.url, reason, kind="unreachable") from None
    except gx.GoogleAPICallError as exc:
        raise StorageError(loc.url, f"GCS refused: {exc.code} {_said(exc)}") from None
    except (ax.DefaultCredentialsError, ax.RefreshError) as exc:
        raise StorageError(
            loc.url, f"no usable Google credentials ({_short(str(exc))}); set GOOGLE_APPLICATION_CREDENTIALS or run with a "
            "service account (STORAGE_EMULATOR_HOST=http://HOST:PORT for an emulator)", kind="denied",
        ) from None  # fmt: skip
    except ax.TransportError as exc:
        raise StorageError(loc.url, f"cannot reach Google's token service: {_short(str(exc))}", kind="unreachable") from None
    except rx.RequestException as exc:
        raise StorageError(loc.url, f"cannot reach GCS{_cause(exc)}", kind="unreachable") from None
    except sx.DataCorruption:
        raise StorageError(loc.url, "the download's checksum does not match the object's") from None
    except sx.InvalidResponse as exc:
        raise StorageError(loc.url, f"GCS answered unexpectedly: {_short(str(exc))}") from None


def _said(exc: Any) -> str:
    """Google's own sentence (error.message of the JSON body), not the request line and body the library prepends."""
    try:
        said = exc.response.json()["error"]["message"]
    except Exception:
        said = getattr(exc, "message", None) or exc
    return _short(str(said))


def _cause(exc: BaseException | None) -> str:
    """`` at ENDPOINT: Connection refused``: where, and the innermost OS reason instead of urllib3's retry story."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):  # retried until the deadline: say what the last answer was
        return f": the last answer was {status} {_said(exc)}"
    where, seen = "", set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        url = getattr(getattr(exc, "request", None), "url", None)
        if not where and isinstance(url, str):
            where = " at " + "://".join(urlsplit(url)[:2])
        if isinstance(exc, OSError) and exc.strerror:
            return f"{where}: {exc.strerror}"
        inner = exc.__cause__ or exc.__context__ or getattr(exc, "reason", None)
        exc = inner if isinstance(inner, BaseException) else next((a for a in exc.args if isinstance(a, BaseException)), None)
    return where


def _short(text: str | None, limit: int = 200) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def put(loc: Location, data: bytes) -> None:
    with _errors(loc):
        _gcs().bucket(loc.bucket).blob(loc.key).upload_from_string(data, content_type="application/octet-stream", retry=_retry())


def get(loc: Location, max_bytes: int | None) -> bytes:
    """With ``max_bytes``, read the size first and download that very generation, so the check holds."""
    with _errors(loc):
        bucket = _gcs().bucket(loc.bucket)
        if max_bytes is None:
            blob = bucket.blob(loc.key)
        else:
            blob = bucket.get_blob(loc.key, retry=_retry())
            if blob is None:
                raise _missing(loc)
            if int(blob.size or 0) > max_bytes:
                raise StorageError(loc.url, f"the object is {blob.size} bytes, over the limit of {max_bytes}", kind="too_large")
        data: bytes = blob.download_as_bytes(retry=_retry())
    return data


def listing(loc: Location) -> list[str]:
    names: list[str] = []
    with _errors(loc, listing=True):
        names += [str(blob.name) for blob in _gcs().list_blobs(loc.bucket, prefix=directory(loc.key), retry=_retry())]
    return sorted(render(loc, name) for name in names if not name.endswith("/"))


def delete(loc: Location) -> None:
    """A missing object is fine; a missing bucket is not."""
    from google.api_core import exceptions as gx

    with _errors(loc):
        try:
            _gcs().bucket(loc.bucket).blob(loc.key).delete(retry=_retry())
        except gx.NotFound:
            if (error := _missing(loc)).kind == "no_bucket":
                raise error from None
