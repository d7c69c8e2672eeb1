"""Resolving JVM components from Maven Central: the pom's versions, the cache folder, a missing Maven."""

from __future__ import annotations

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
