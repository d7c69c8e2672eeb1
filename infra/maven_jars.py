"""JVM components from Maven Central: a small pom, its run-time dependencies copied by ``mvn`` into a cache
folder outside the work tree, reused when present.

Apache Kafka (``kafka/pom.xml``), Kafka Connect with Debezium (``connect/pom.xml``) and Apicurio Registry
(``registry/pom.xml``, an archive unpacked rather than jars copied) are resolved the same way; only their
pom, their cache folder and what proves a folder complete differ. A resolution goes to a folder of its own
(``<folder>.<random>.partial``) and is renamed when whole, so an interrupted one is never taken for a
complete one, and two at once (two clones set up together) do not write into one folder: the first renamed
in place is kept, the others are dropped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["JarSetupError", "cache_folder", "pom_property", "resolve_jars"]


class JarSetupError(RuntimeError):
    """A JVM component cannot be prepared (no Java, no Maven, no jars); the message says what to install."""


def pom_property(pom: Path, name: str) -> str:
    """The value of ``<name>`` among the pom's properties (a version: one place to change it)."""
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom.read_text())
    if match is None:
        raise JarSetupError(f"{pom} names no <{name}>")
    return match.group(1).strip()


def cache_folder(env_var: str, name: str, environ: Mapping[str, str] = os.environ) -> Path:
    """``$<env_var>``, else ``$XDG_CACHE_HOME/mvlog/<name>`` (``~/.cache/mvlog/<name>``)."""
    if environ.get(env_var):
        return Path(environ[env_var]).expanduser()
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mvlog" / name


def resolve_jars(pom: Path, home: Path, *, what: str, env_var: str,
                 properties: Mapping[str, str] | None = None, unpack: bool = False, folder: str = "libs") -> Path:
    """Copy ``pom``'s run-time dependencies into ``home/<folder>`` with ``mvn`` and return that folder.
    ``what`` names the component in messages; ``env_var`` is the setting that points at jars resolved
    elsewhere; ``properties`` are passed to Maven as ``-Dname=value``. ``unpack``: run the pom's
    ``dependency:unpack`` instead (an application published whole as an archive: its artifact items)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarSetupError(f"{what}'s jars are not resolved yet and Maven is missing: install it "
                            f"(`apt-get install -y maven`; `make setup` does it) or set {env_var} to a folder "
                            "whose libs/ holds them.")
    home.parent.mkdir(parents=True, exist_ok=True)
    found_before = home.exists()
    # A folder of this resolution's own: two setups at once (two clones) never unpack into one another's.
    partial = Path(tempfile.mkdtemp(prefix=f"{home.name}.", suffix=".partial", dir=home.parent))
    goal = ["dependency:unpack"] if unpack else ["dependency:copy-dependencies", "-DincludeScope=runtime"]
    command = [mvn, "-q", "-B", "-f", str(pom), *goal,
               *(f"-D{name}={value}" for name, value in (properties or {}).items()),
               f"-DoutputDirectory={partial / folder}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise JarSetupError(f"Maven could not resolve {what} (`{' '.join(command)}`):\n"
                            f"{(done.stdout + done.stderr)[-3000:]}")
    _install(partial, home, found_before=found_before)
    return home / folder


def _install(partial: Path, home: Path, *, found_before: bool) -> None:
    """Rename the whole ``partial`` folder to ``home``. A ``home`` that appeared while Maven ran is another
    resolution's whole folder and is kept (ours is dropped); one found before is stale (an interrupted copy
    by hand, a component's earlier layout) and is set aside in one rename, then removed. Never a moment
    where a reader sees a half-written ``home``."""
    if home.exists() and not found_before:
        shutil.rmtree(partial, ignore_errors=True)
        return
    if home.exists():
        aside = partial.with_suffix(".old")
        with contextlib.suppress(FileNotFoundError):  # another resolution set it aside first
            home.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)
    try:
        partial.replace(home)
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        shutil.rmtree(partial, ignore_errors=True)  # another resolution renamed its whole folder first
