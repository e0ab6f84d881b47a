"""How a model of your own travels: laptop -> the job directory -> the syncer -> the job answer -> learners.

On the laptop ``ship`` copies the module's source (one ``.py`` file, or a package's ``.py`` files)
into the job directory's ``model/`` folder and returns the spec in the module form the VMs import.
The syncer imports it from there (``search=JOB_DIR/model``) and ``pack``s the same files into its
``GET /v1/job`` answer, since a learner has no job directory; each learner ``unpack``s them into a
folder named by their digest and imports from that. Only Python source travels: the packages it
imports (torch, transformers, ...) must be installed on the VMs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from ddctl_agents.train.contract import refusal, split_spec

MODEL_DIR = "model"
"""The job directory's folder that holds the shipped source."""
MAX_SOURCE_BYTES = 4 * 2**20
"""Most source shipped with a job: it travels in every learner's job answer."""
PRESENT = "ddctl_agents"
"""The agents' own package, on every VM: a spec inside it is not copied."""


def ship(spec: str, job_dir: Path) -> str:
    """Copy ``spec``'s source into ``job_dir/model/``; returns the spec as the agents must use it.

    Shipping a returned spec again into the same ``job_dir`` is a no-op, so callers need not know whether it was."""
    if not spec:
        return ""
    where, name = split_spec(spec)
    if where.endswith(".py"):
        source = Path(where).expanduser().resolve()
        if not source.is_file():
            raise refusal("load", f"{spec}: no file {source}")
        top, files = source.stem, {source.name: source}
        if not top.isidentifier():
            raise refusal("spec", f"{spec}: {source.name} cannot be imported; name the file like a Python module")
    else:
        top = where.partition(".")[0]
        shipped = job_dir / MODEL_DIR
        if top == PRESENT or (shipped / top).is_dir() or (shipped / f"{top}.py").is_file():
            return spec  # on every VM already, or shipped before: shipping again changes nothing
        files = _sources(spec, top)
    if top in sys.stdlib_module_names or top in ("ddctl", "ddctl_agents"):
        raise refusal("spec", f"{spec}: a module named {top} would shadow {top} on the VMs; rename it")
    size = sum(path.stat().st_size for path in files.values())
    if size > MAX_SOURCE_BYTES:
        raise refusal("load", f"{spec}: {size} bytes of source; at most {MAX_SOURCE_BYTES} travel with a job")
    for relative, path in files.items():
        target = job_dir / MODEL_DIR / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    return f"{top}:{name}" if where.endswith(".py") else spec


def _sources(spec: str, top: str) -> dict[str, Path]:
    """The ``.py`` files of module or package ``top`` as found on this machine, by path relative to its parent."""
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError) as exc:
        raise refusal("load", f"{spec}: cannot find {top}: {exc}") from None
    if found is None:
        raise refusal("load", f"{spec}: no module {top} on this machine; give path/to/file.py:factory instead")
    if found.origin is None or not found.origin.endswith(".py"):
        raise refusal("load", f"{spec}: {top} is not Python source ({found.origin}); only source files can be shipped")
    origin = Path(found.origin)
    if found.submodule_search_locations is None:
        return {origin.name: origin}
    package = origin.parent
    return {
        str(path.relative_to(package.parent)): path
        for path in sorted(package.rglob("*.py"))
        if "__pycache__" not in path.relative_to(package).parts
    }


def pack(model_dir: Path | None) -> dict[str, str]:
    """Every shipped source file under ``model_dir`` by its relative POSIX path (empty without one)."""
    if model_dir is None or not model_dir.is_dir():
        return {}
    return {
        path.relative_to(model_dir).as_posix(): path.read_text()
        for path in sorted(model_dir.rglob("*.py"))
        if "__pycache__" not in path.relative_to(model_dir).parts
    }


def digest(files: Mapping[str, str]) -> str:
    """sha256 over the files' names and contents, in name order."""
    hasher = hashlib.sha256()
    for name in sorted(files):
        for part in (name, files[name]):
            data = part.encode()
            hasher.update(len(data).to_bytes(8, "little") + data)
    return hasher.hexdigest()


def received(files: object) -> None:
    """Files that came with a job are names to texts, at most ``MAX_SOURCE_BYTES`` in all (a list, a number or a NUL
    in a name was a TypeError, AttributeError or ValueError out of the learner's start)."""
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise refusal("load", f"the job's model files must map names to source texts, got {type(files).__name__}")
    if not all(name.isprintable() and "\0" not in text for name, text in files.items()):
        raise refusal("load", "the job's model files hold a name that is not printable or a NUL byte")
    size = sum(len(name.encode()) + len(text.encode("utf-8", "surrogatepass")) for name, text in files.items())
    if size > MAX_SOURCE_BYTES:
        raise refusal("load", f"the job's model files are {size} bytes; at most {MAX_SOURCE_BYTES} travel with a job")


def unpack(files: Mapping[str, str], root: Path | None = None) -> Path | None:
    """Write ``pack``'s files under ``root`` (the temp dir) in a folder named by their digest; its path, or None.

    A folder already there is the same files (its name is their digest): ranks on one machine share it."""
    if not files:
        return None
    received(files)
    for name in files:
        parts = PurePosixPath(name).parts
        if not name.endswith(".py") or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
            raise refusal("load", f"shipped model file {name!r}: allowed are relative paths of .py files")
    target = (root or Path(tempfile.gettempdir())) / f"ddctl-model-{digest(files)[:16]}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".ddctl-model-", dir=target.parent))
    for name, text in files.items():
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    try:
        os.replace(staging, target)
    except OSError:  # another rank got there first, with the same files
        shutil.rmtree(staging, ignore_errors=True)
        if not target.is_dir():
            raise
    return target


__all__ = ["MAX_SOURCE_BYTES", "MODEL_DIR", "digest", "pack", "ship", "unpack"]
