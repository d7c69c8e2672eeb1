"""Resolving JVM components from Maven Central: the pom's versions, the cache folder, a missing Maven."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mvlog.infra.kafka_broker import POM, kafka_version
from mvlog.infra.maven_jars import JarSetupError, cache_folder, pom_property, resolve_jars
from mvlog.infra.schema_registry import _runner, apicurio_version, registry_home


def test_versions_come_from_the_pom_and_a_missing_one_is_named(tmp_path: Path) -> None:
    assert kafka_version() == pom_property(POM, "kafka.version") and kafka_version()[0].isdigit()
    pom = tmp_path / "pom.xml"
    pom.write_text("<project><properties><x.version>1.2</x.version></properties></project>")
    assert pom_property(pom, "x.version") == "1.2"
    with pytest.raises(JarSetupError, match=r"names no <y\.version>"):
        pom_property(pom, "y.version")


def test_the_cache_folder_is_the_setting_else_under_the_xdg_cache() -> None:
    assert cache_folder("MVLOG_X_HOME", "x-1", {"MVLOG_X_HOME": "/opt/x"}) == Path("/opt/x")
    assert cache_folder("MVLOG_X_HOME", "x-1", {"XDG_CACHE_HOME": "/c"}) == Path("/c/mvlog/x-1")


def test_without_maven_the_error_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn there
    with pytest.raises(JarSetupError, match=r"Maven is missing: install it .*apt-get install -y maven.*MVLOG_X_HOME"):
        resolve_jars(POM, tmp_path / "home", what="X", env_var="MVLOG_X_HOME")
    assert not (tmp_path / "home").exists()


def test_the_registry_is_a_complete_unpacked_app_in_its_versioned_cache(tmp_path: Path) -> None:
    """Apicurio Registry's folder is named after the pom's version; a folder with a runner jar but no lib/
    (an interrupted copy by hand) is not taken for the application."""
    assert apicurio_version()[0].isdigit()
    assert registry_home({"XDG_CACHE_HOME": "/c"}) == Path(f"/c/mvlog/apicurio-registry-{apicurio_version()}")
    assert registry_home({"MVLOG_SCHEMA_REGISTRY_HOME": "/r"}) == Path("/r")
    app = tmp_path / "app"
    app.mkdir()
    (app / "apicurio-registry-app-3.0.9-runner.jar").touch()
    assert _runner(app) is None
    (app / "lib").mkdir()
    assert _runner(app) == app / "apicurio-registry-app-3.0.9-runner.jar"
    assert _runner(tmp_path / "absent") is None


def _fake_mvn(folder: Path, body: str) -> None:
    """An ``mvn`` on PATH that runs ``body`` with $out set to its -DoutputDirectory."""
    script = folder / "mvn"
    script.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#*=}";; esac; done\n'
                      + body + "\n")
    script.chmod(0o755)


@pytest.mark.parametrize("stale", [False, True], ids=["fresh", "over-a-stale-folder"])
def test_resolutions_at_once_each_write_a_folder_of_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             stale: bool) -> None:
    """Setups resolving one component at once (two clones) used to unpack into one ``.partial`` folder and
    fail, then to race between removing ``home`` and renaming into it (ENOTEMPTY in CI); each now writes a
    folder of its own and one whole folder is kept, over a stale one too. A failed resolution leaves no
    folder behind."""
    tools = tmp_path / "bin"
    tools.mkdir()
    _fake_mvn(tools, 'mkdir -p "$out" && sleep 0.3 && echo "$$" > "$out/x.jar"')
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    home = tmp_path / "cache" / "x-1"
    if stale:
        (home / "libs").mkdir(parents=True)
        (home / "libs" / "half.jar").touch()
    with ThreadPoolExecutor(6) as pool:
        found = list(pool.map(lambda _: resolve_jars(POM, home, what="X", env_var="MVLOG_X_HOME"), range(6)))
    assert found == [home / "libs"] * 6
    assert [p.name for p in (home / "libs").iterdir()] == ["x.jar"]
    assert sorted(p.name for p in home.parent.iterdir()) == ["x-1"], "no partial folder is left"
    _fake_mvn(tools, 'mkdir -p "$out" && echo "no network" && exit 1')
    with pytest.raises(JarSetupError, match="no network"):
        resolve_jars(POM, tmp_path / "cache" / "y-1", what="Y", env_var="MVLOG_Y_HOME")
    assert sorted(p.name for p in home.parent.iterdir()) == ["x-1"]
