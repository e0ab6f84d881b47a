"""ddctl_agents.storage: the same behaviour on a local path, file://, S3 (a real moto server) and GCS (tests/gcs_fake.py).

The clouds are reached the way production reaches them: boto3 through AWS_ENDPOINT_URL, google-cloud-storage through
STORAGE_EMULATOR_HOST, so what is tested is the real SDK's request path and the error mapping on its real exceptions.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from ddctl_agents import storage
from ddctl_agents.errors import AgentError
from ddctl_agents.storage import StorageError, _gcs
from gcs_fake import GcsFake

FORMS = "a local path, file://PATH, s3://BUCKET/KEY or gs://BUCKET/KEY"
MIB = 1024 * 1024


def refused(call: Callable[[], object], kind: str, *needles: str) -> StorageError:
    """The StorageError ``call`` raises: its kind, the words it must say, and no SDK traceback chained to it."""
    with pytest.raises(StorageError) as info:
        call()
    err = info.value
    assert err.kind == kind, str(err)
    for needle in needles:
        assert needle in str(err), f"{needle!r} not in {str(err)!r}"
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__), "an SDK error leaks through"
    return err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> None:
    """Only these AWS_* variables (dummy credentials, no profile files, no instance metadata), plus ``env``."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    base = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials")}  # fmt: skip
    for name, value in {**base, **env}.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """A boto3 client on the moto server, which this process's storage module also reaches through AWS_ENDPOINT_URL."""
    aws_env(monkeypatch, tmp_path, AWS_ENDPOINT_URL=moto_endpoint)
    return boto3.session.Session().client("s3")


@pytest.fixture(scope="module")
def gcs_server() -> Iterator[GcsFake]:
    with GcsFake() as fake:
        yield fake


@pytest.fixture
def gcs(gcs_server: GcsFake, monkeypatch: pytest.MonkeyPatch) -> GcsFake:
    """A wiped fake that google-cloud-storage reaches through STORAGE_EMULATOR_HOST, with no Google credentials at all."""
    gcs_server.reset()
    gcs_server.page_size = 1000
    for name in [n for n in os.environ if n.startswith(("GOOGLE_", "CLOUDSDK_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.endpoint)
    monkeypatch.setenv("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")  # no background bucket GETs in calls()
    return gcs_server


def new_bucket() -> str:
    return f"ddctl-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["path", "file", "s3", "gs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where this test's objects go: a directory, a file:// URL, or a fresh bucket on moto or the GCS fake."""
    if request.param == "path":
        return str(tmp_path / "store")
    if request.param == "file":
        return f"file://{tmp_path}/store"
    bucket = new_bucket()
    if request.param == "s3":
        request.getfixturevalue("s3").create_bucket(Bucket=bucket)
    else:
        request.getfixturevalue("gcs").create_bucket(bucket)
    return f"{request.param}://{bucket}"


# --- the same behaviour on every backend -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 17, 5_000_000, 9 * MIB + 1], ids=["empty", "17B", "5MB", "9MiB"])
def test_a_put_object_reads_back_byte_for_byte(store: str, size: int) -> None:
    """9 MiB is past GCS's 8 MiB multipart limit: the client switches to a resumable upload."""
    data = random.Random(size).randbytes(size)
    url = storage.join(store, "deep/er", f"object-{size}.bin")
    storage.put(url, data)
    assert storage.get(url) == data
    assert storage.get(url, max_bytes=size) == data  # exactly at the limit is allowed


def test_put_replaces_the_whole_object(store: str) -> None:
    url = storage.join(store, "ckpt/latest")
    storage.put(url, b"a much longer first version")
    storage.put(url, b"v2")
    assert storage.get(url) == b"v2"
    assert storage.listing(storage.join(store, "ckpt")) == [url]


def test_listing_is_sorted_recursive_and_stays_under_its_directory(store: str, request: pytest.FixtureRequest) -> None:
    if store.startswith("gs://"):
        request.getfixturevalue("gcs").page_size = 2  # the client must follow nextPageToken
    names = ["ckpt/a/z", "ckpt/a/sub/2", "ckpt/ab/3", "ckpt/a/1", "other/4", "ckpt/a.txt"]
    for name in names:
        storage.put(storage.join(store, name), name.encode())
    expected = [storage.join(store, n) for n in ("ckpt/a/1", "ckpt/a/sub/2", "ckpt/a/z")]
    assert storage.listing(storage.join(store, "ckpt/a")) == expected  # not ckpt/ab/ nor ckpt/a.txt
    assert storage.listing(storage.join(store, "ckpt/a/")) == expected
    assert [storage.get(u) for u in expected] == [b"ckpt/a/1", b"ckpt/a/sub/2", b"ckpt/a/z"]
    assert storage.listing(store) == sorted(storage.join(store, n) for n in names)
    assert storage.listing(storage.join(store, "nothing-here")) == []


def test_a_deleted_object_is_no_such_object_and_deleting_again_is_fine(store: str) -> None:
    url, kept = storage.join(store, "runs/r1/step-1"), storage.join(store, "runs/r1/step-2")
    storage.put(url, b"x")
    storage.put(kept, b"y")
    storage.delete(url)
    refused(lambda: storage.get(url), "missing", url, "no such object")
    refused(lambda: storage.get(url, max_bytes=10), "missing", url, "no such object")
    storage.delete(url)  # already gone: fine
    assert storage.listing(storage.join(store, "runs")) == [kept]


def test_an_object_over_max_bytes_is_refused(store: str, request: pytest.FixtureRequest) -> None:
    url = storage.join(store, "big")
    storage.put(url, bytes(100))
    refused(lambda: storage.get(url, max_bytes=99), "too_large", url, "100 bytes", "limit of 99")
    refused(lambda: storage.get(url, max_bytes=-1), "malformed", "max_bytes")
    if store.startswith("gs://"):  # the size was read from the metadata: the bytes were never asked for
        assert not [c for c in request.getfixturevalue("gcs").calls("objects.get") if c.media]


@pytest.mark.parametrize("verb", ["put", "get", "delete", "listing"])
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("", "empty"),
        ("http://host/x", "unknown scheme"),
        ("S3://bucket/key", "unknown scheme"),
        ("file://", "without a PATH"),
        ("/data/../etc/passwd", "'..'"),
        ("file:///data/../x", "'..'"),
        ("s3://", "bucket name"),
        ("s3://Bad_Bucket/key", "bad S3 bucket name 'Bad_Bucket'"),
        ("s3://ab/key", "bad S3 bucket name"),
        ("s3://10.0.0.1/key", "bad S3 bucket name"),
        ("s3://a..b/key", "bad S3 bucket name"),
        ("s3://xn--bucket/key", "bad S3 bucket name"),
        ("gs://goog-bucket/key", "bad GCS bucket name"),
        ("gs://my-google-data/key", "bad GCS bucket name"),
        ("gs://-bucket/key", "bad GCS bucket name"),
        ("gs://" + "a" * 64 + "/key", "bad GCS bucket name"),
        ("gs://bucket/a/../b", "'..' segment"),
        ("s3://bucket/./b", "'.' or '..' segment"),
        ("s3://bucket/" + "k" * 1025, "longer than 1024"),
        ("gs://bucket/line\nbreak", "control character"),
    ],
)
def test_malformed_urls_are_refused_before_any_io(verb: str, url: str, why: str) -> None:
    call: Callable[[], object] = {
        "put": lambda: storage.put(url, b"x"), "get": lambda: storage.get(url), "delete": lambda: storage.delete(url),
        "listing": lambda: storage.listing(url),
    }[verb]  # fmt: skip
    err = refused(call, "malformed", why, FORMS)
    assert isinstance(err, AgentError)


@pytest.mark.parametrize("url", ["s3://bucket", "s3://bucket/", "gs://bucket", "s3://bucket/dir/"])
def test_an_object_needs_a_key_but_a_listing_does_not(url: str) -> None:
    for call in (lambda: storage.put(url, b"x"), lambda: storage.get(url), lambda: storage.delete(url)):
        refused(call, "malformed", url, "KEY", FORMS)


def test_gcs_accepts_its_longer_dotted_and_underscored_bucket_names(gcs: GcsFake) -> None:
    for bucket in ("a" * 63 + "." + "b" * 63, "under_score"):
        gcs.create_bucket(bucket)
        storage.put(f"gs://{bucket}/k", b"ok")
        assert storage.get(f"gs://{bucket}/k") == b"ok"
    refused(lambda: storage.put("s3://under_score/k", b"x"), "malformed", "bad S3 bucket name")


# --- the clouds' own failures ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_missing_bucket_is_named(scheme: str, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("s3" if scheme == "s3" else "gcs")
    bucket = new_bucket()
    url = f"{scheme}://{bucket}/ckpt/0"
    for call in (lambda: storage.get(url), lambda: storage.get(url, max_bytes=5), lambda: storage.put(url, b"x"),
                 lambda: storage.delete(url), lambda: storage.listing(f"{scheme}://{bucket}/ckpt")):  # fmt: skip
        refused(call, "no_bucket", f"no such bucket {bucket!r}", f"{scheme}://{bucket}/")


class _S3Says(BaseHTTPRequestHandler):
    """S3 answering every request with one error (``server.said``: status, code, message), as S3 writes errors."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, code, message = self.server.said  # type: ignore[attr-defined]
        body = f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>1</RequestId></Error>".encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_DELETE = do_HEAD = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("said", "kind", "reason"),
    [
        ((403, "AccessDenied", "Access Denied"), "denied", "access denied (AccessDenied: Access Denied)"),
        (
            (503, "SlowDown", "Please reduce your request rate."),
            "unreachable",
            "S3 is unavailable, even after retrying (SlowDown",
        ),
        ((400, "InvalidArgument", "Bad header"), "failed", "S3 refused: InvalidArgument Bad header"),
    ],
)
def test_s3_refusals_are_classified(
    said: tuple[int, str, str], kind: str, reason: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _S3Says)
    server.said = said  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        aws_env(monkeypatch, tmp_path, AWS_ENDPOINT_URL=f"http://127.0.0.1:{server.server_port}", AWS_MAX_ATTEMPTS="1")
        for call in (lambda: storage.get("s3://bucket/k"), lambda: storage.put("s3://bucket/k", b"x")):
            refused(call, kind, "s3://bucket/k", reason)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_gcs_access_denied_is_named_without_the_request_dump(gcs: GcsFake) -> None:
    gcs.create_bucket("bucket")
    storage.put("gs://bucket/k", b"x")
    gcs.fail("objects.get", 403)
    err = refused(lambda: storage.get("gs://bucket/k"), "denied", "gs://bucket/k", "access denied (403: fault injected")
    assert "http://" not in str(err)  # Google's sentence, not the library's "GET <url>: <body>"
    gcs.fail("objects.insert", 401)
    refused(lambda: storage.put("gs://bucket/k", b"y"), "denied", "no usable Google credentials")  # a 401 asks for a refresh
    gcs.reset()
    gcs.create_bucket("bucket")
    gcs.fail("objects.insert", 429, times=1)
    storage.put("gs://bucket/k", b"y")  # a 429 is retried
    assert gcs.objects("bucket") == {"k": b"y"}
    gcs.fail("objects.insert", 400)
    refused(lambda: storage.put("gs://bucket/k", b"z"), "failed", "GCS refused: 400 fault injected")


def test_an_unreachable_s3_endpoint_is_reported_and_the_client_follows_the_environment(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = new_bucket()
    s3.create_bucket(Bucket=bucket)
    storage.put(f"s3://{bucket}/k", b"here")
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    refused(lambda: storage.get(f"s3://{bucket}/k"), "unreachable", "cannot reach S3", dead)


def test_the_s3_specific_endpoint_variable_wins(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """boto3 itself prefers AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL (nothing in storage reads either)."""
    aws_env(monkeypatch, tmp_path, AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", AWS_ENDPOINT_URL_S3=moto_endpoint,
            AWS_MAX_ATTEMPTS="1")  # fmt: skip
    bucket = new_bucket()
    boto3.session.Session().client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    storage.put(f"s3://{bucket}/k", b"via the S3 endpoint")
    assert storage.get(f"s3://{bucket}/k") == b"via the S3 endpoint"


def test_no_aws_credentials_is_reported(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    aws_env(monkeypatch, tmp_path, AWS_ENDPOINT_URL=moto_endpoint)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    refused(lambda: storage.get("s3://bucket/k"), "denied", "no usable AWS credentials")


def test_an_unreachable_gcs_endpoint_is_reported_after_retrying(gcs: GcsFake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gcs, "RETRY_S", 0.3)  # not the 120 s a real call may take
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    for call in (lambda: storage.put("gs://bucket/k", b"x"), lambda: storage.get("gs://bucket/k")):
        refused(call, "unreachable", "gs://bucket/k", "GCS unreachable or unavailable, gave up retrying", "Connection refused")


def test_gcs_unavailable_until_the_deadline_is_unreachable(gcs: GcsFake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gcs, "RETRY_S", 0.3)
    gcs.create_bucket("bucket")
    storage.put("gs://bucket/k", b"x")
    gcs.fail("objects.get", 503)
    refused(lambda: storage.get("gs://bucket/k"), "unreachable", "gave up retrying after 0.3 s: the last answer was 503 fault")


# --- local files -----------------------------------------------------------------------------------------------------


def test_a_local_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ckpt" / "latest"
    storage.put(str(target), b"old")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("fsync")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    def crash(src: str, dst: str) -> None:
        synced.append("replace")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    refused(lambda: storage.put(str(target), b"new"), "failed", str(target), "No space left on device")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["latest"]  # the temporary file is gone
    assert synced == ["fsync", "replace"]  # the data was on disk before the rename


def test_local_paths_that_are_directories_are_not_objects(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    refused(lambda: storage.get(str(tmp_path / "d")), "malformed", "directory")
    refused(lambda: storage.put(str(tmp_path / "d"), b"x"), "malformed", "directory")
    assert storage.listing(str(tmp_path / "d")) == []
    storage.put(str(tmp_path / "f"), b"x")
    assert storage.listing(str(tmp_path / "f")) == []  # a file is not a directory to list


# --- pure helpers ----------------------------------------------------------------------------------------------------


def test_join() -> None:
    assert storage.join("s3://b", "a", "b/c") == "s3://b/a/b/c"
    assert storage.join("gs://b/", "a/", "c") == "gs://b/a/c"
    assert storage.join("/tmp/x", "", "y") == "/tmp/x/y"
    assert storage.join("file:///tmp", "a") == "file:///tmp/a"
    assert storage.join("s3://b/k") == "s3://b/k"
    refused(lambda: storage.join("s3://b", "/etc"), "malformed", "absolute part '/etc'")
    refused(lambda: storage.join("", "a"), "malformed", "empty base")


def test_is_remote() -> None:
    assert storage.is_remote("s3://b/k") and storage.is_remote("gs://b/k")
    assert not any(map(storage.is_remote, ["/tmp/x", "file:///tmp/x", "relative/s3://x", "S3://b/k", "http://x/y"]))


def test_importing_storage_imports_no_cloud_sdk() -> None:
    code = "import sys, ddctl_agents.storage; print(sorted(m for m in ('boto3', 'google.cloud.storage') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1] / "agents"
    )
    assert out.stdout.strip() == "[]"
