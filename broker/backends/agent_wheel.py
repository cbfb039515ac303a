"""The node agent's wheel: the broker's own pure-Python packages, for ``pip install`` on cloud nodes.

The agent needs only the standard library, so the wheel carries the ``broker`` and ``providers``
packages as they are imported in this process (from a checkout or an installed broker alike) and
declares no dependencies: nodes install it with ``--no-deps`` in seconds and never resolve the
broker's server-side stack. The version carries a hash of the files, so a changed agent is a new
wheel and nodes reinstall it, while an unchanged one is built once and reused.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

DIST_NAME = "spot_broker_agent"
BASE_VERSION = "0.1.0"
PACKAGES = ("broker", "providers")


def _package_files() -> list[tuple[str, Path]]:
    import broker
    import providers

    files: list[tuple[str, Path]] = []
    for module in (broker, providers):
        root = Path(module.__file__ or "").parent
        data = sorted(root.glob("*.csv")) if module is providers else []  # the built-in catalog's rows
        for path in sorted(root.rglob("*.py")) + data:
            if "__pycache__" in path.parts:
                continue
            files.append((f"{root.name}/{path.relative_to(root).as_posix()}", path))
    return files


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_agent_wheel(dest: Path) -> Path:
    """Write (or reuse) the agent wheel in ``dest`` and return its path."""
    files = _package_files()
    content = hashlib.sha256()
    for name, path in files:
        content.update(name.encode() + b"\0" + path.read_bytes())
    version = f"{BASE_VERSION}+g{content.hexdigest()[:12]}"
    wheel = dest / f"{DIST_NAME}-{version}-py3-none-any.whl"
    if wheel.exists():
        return wheel
    dest.mkdir(parents=True, exist_ok=True)
    dist_info = f"{DIST_NAME}-{version}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {DIST_NAME.replace('_', '-')}\nVersion: {version}\n"
                "Summary: The spot broker's node agent (python -m broker.agent)\nRequires-Python: >=3.11\n")
    wheel_info = "Wheel-Version: 1.0\nGenerator: spot-broker\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries: list[tuple[str, bytes]] = [(name, path.read_bytes()) for name, path in files]
    entries += [(f"{dist_info}/METADATA", metadata.encode()), (f"{dist_info}/WHEEL", wheel_info.encode()),
                (f"{dist_info}/top_level.txt", "\n".join(PACKAGES).encode() + b"\n")]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    record += f"{dist_info}/RECORD,,\n"
    tmp = wheel.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
        archive.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), record)
    os.replace(tmp, wheel)
    return wheel
