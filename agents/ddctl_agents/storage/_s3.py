"""S3 (and anything that speaks it: MinIO, moto, R2) through boto3, imported only when an s3:// URL is used.

boto3 resolves the endpoint and credentials itself: ``AWS_ENDPOINT_URL_S3`` before ``AWS_ENDPOINT_URL``
(botocore's configured-endpoint support, unless ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` is true), then
its credential chain (environment, profile files, SSO, instance role). Retries follow its own settings
(``AWS_MAX_ATTEMPTS``, ``AWS_RETRY_MODE``). A client is made on first use and remade when an ``AWS_*``
variable changes, since it freezes what it read from the environment.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ddctl_agents.storage._location import Location, StorageError, directory, render

_NOT_FOUND = {"NoSuchKey", "NotFound", "404"}
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
           "ExpiredToken", "InvalidToken", "AccountProblem"}  # fmt: skip
_BUSY = {"SlowDown", "RequestTimeout", "Throttling", "ThrottlingException", "ServiceUnavailable", "InternalError"}
_lock = threading.Lock()
_client: tuple[tuple[tuple[str, str], ...], Any] | None = None


def _s3() -> Any:
    """The cached client, remade when the AWS_* environment changed since it was made."""
    global _client
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    with _lock:
        if _client is None or _client[0] != env:
            import boto3  # lazily: most commands never touch S3

            if _client is not None:
                with contextlib.suppress(Exception):
                    _client[1].close()  # its pooled connections, now
            _client = (env, boto3.session.Session().client("s3"))
        return _client[1]


@contextlib.contextmanager
def _errors(loc: Location) -> Iterator[None]:
    """botocore's errors → StorageError with a short reason; the only place that knows them."""
    from botocore import exceptions as bx

    try:
        yield
    except bx.ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", "")).strip()
        if code == "NoSuchBucket":
            raise StorageError(loc.url, f"no such bucket {loc.bucket!r}", kind="no_bucket") from None
        if code in _NOT_FOUND:
            raise StorageError(loc.url, "no such object", kind="missing") from None
        said = f"{code}: {message}" if message else code
        if code in _DENIED:
            raise StorageError(loc.url, f"access denied ({said})", kind="denied") from None
        if code in _BUSY or int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)) >= 500:
            raise StorageError(loc.url, f"S3 is unavailable, even after retrying ({said[:200]})", kind="unreachable") from None
        raise StorageError(loc.url, f"S3 refused: {code or 'error'} {message[:200]}".rstrip()) from None
    except (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError, bx.ProfileNotFound) as exc:
        raise StorageError(
            loc.url, f"no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or a role",
            kind="denied",
        ) from None  # fmt: skip
    except (bx.ConnectionError, bx.HTTPClientError) as exc:
        raise StorageError(loc.url, f"cannot reach S3: {exc}", kind="unreachable") from None
    except bx.BotoCoreError as exc:
        raise StorageError(loc.url, f"S3 client error: {exc}") from None


def put(loc: Location, data: bytes) -> None:
    with _errors(loc):
        _s3().put_object(Bucket=loc.bucket, Key=loc.key, Body=data)


def get(loc: Location, max_bytes: int | None) -> bytes:
    """One GET: its headers carry the size, so an object over ``max_bytes`` is refused before its body is read."""
    with _errors(loc):
        answer = _s3().get_object(Bucket=loc.bucket, Key=loc.key)
        body = answer["Body"]
        size = int(answer.get("ContentLength", 0))
        if max_bytes is not None and size > max_bytes:
            body.close()
            raise StorageError(loc.url, f"the object is {size} bytes, over the limit of {max_bytes}", kind="too_large")
        with contextlib.closing(body):
            data: bytes = body.read()
    return data


def listing(loc: Location) -> list[str]:
    keys: list[str] = []
    with _errors(loc):
        pages = _s3().get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=directory(loc.key))
        for page in pages:
            keys += [str(item["Key"]) for item in page.get("Contents", ())]
    return sorted(render(loc, key) for key in keys if not key.endswith("/"))  # not a console's "folder" marker


def delete(loc: Location) -> None:
    """S3 answers 204 for a missing key too; a missing bucket is still an error."""
    with _errors(loc):
        _s3().delete_object(Bucket=loc.bucket, Key=loc.key)
