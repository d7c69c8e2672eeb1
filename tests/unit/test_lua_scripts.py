"""The Redis stores' Lua scripts in ``connectors/redis/lua/``: every file is read by a store, and each
script is composed from its shared functions and its body (pure: no Redis; the integration tests of the
stores run them)."""

from __future__ import annotations

import importlib
import pkgutil
from importlib.resources import files

import pytest

import mvlog.connectors.redis as redis_connectors
from mvlog.connectors.redis import lua_scripts
from mvlog.connectors.redis.lua_scripts import lua_script, read_lua

LUA = files("mvlog.connectors.redis") / "lua"


def _lua_files() -> set[str]:
    names = {entry.name.removesuffix(".lua") for entry in LUA.iterdir() if entry.name.endswith(".lua")}
    return names | {f"lib/{entry.name.removesuffix('.lua')}" for entry in (LUA / "lib").iterdir()
                    if entry.name.endswith(".lua")}


def _import_stores() -> None:
    for module in pkgutil.iter_modules(redis_connectors.__path__):
        importlib.import_module(f"{redis_connectors.__name__}.{module.name}")


def test_every_lua_file_is_read_by_a_store() -> None:
    _import_stores()
    files_ = _lua_files()
    assert files_, "no .lua files found (package data not installed?)"
    assert files_ - lua_scripts.LOADED == set(), "Lua files no store reads"
    assert lua_scripts.LOADED - files_ == set()


def _store_scripts() -> dict[str, str]:
    _import_stores()
    scripts = {}
    for module in pkgutil.iter_modules(redis_connectors.__path__):
        loaded = importlib.import_module(f"{redis_connectors.__name__}.{module.name}")
        for attribute, value in vars(loaded).items():
            if isinstance(value, str) and "redis.call(" in value and not attribute.startswith("__"):
                scripts[f"{module.name}.{attribute}"] = value
    return scripts


def test_stores_scripts_define_the_functions_they_call() -> None:
    scripts = _store_scripts()
    assert len(scripts) >= 15
    libs = [lib.removeprefix("lib/") for lib in _lua_files() if lib.startswith("lib/")]
    for where, script in scripts.items():
        for lib in libs:
            calls = script.count(f"{lib}(") - script.count(f"local function {lib}(")
            if calls:
                assert script.count(f"local function {lib}(") == 1, f"{where} calls {lib} without defining it"


def test_the_view_commit_gets_the_journal_limit() -> None:
    from mvlog.connectors.redis import epoch_commit

    assert epoch_commit._COMMIT_SCRIPT.startswith("\n" + read_lua("lib/each_chunk") + "\n")
    assert "JOURNAL_LIMIT" not in epoch_commit._COMMIT_SCRIPT
    assert f"-{epoch_commit.JOURNAL_LIMIT}, -1)" in epoch_commit._COMMIT_SCRIPT


@pytest.mark.parametrize("name", sorted(name for name in _lua_files() if not name.startswith("lib/")))
def test_each_script_builds(name: str) -> None:
    body = read_lua(name)
    libs = [lib.removeprefix("lib/") for lib in sorted(_lua_files()) if lib.startswith("lib/")]
    used = [lib for lib in libs if f"{lib}(" in body]
    constants = {"JOURNAL_LIMIT": 7} if "JOURNAL_LIMIT" in body else None
    script = lua_script(name, lib=used, constants=constants)
    assert "redis.call(" in script
    assert script.endswith(body.replace("JOURNAL_LIMIT", "7"))
    for lib in used:
        assert f"local function {lib}(" in script
    # Every function a script calls from lib/ is defined before its body (one Lua chunk, top to bottom).
    for lib in libs:
        if f"{lib}(" in body:
            assert script.index(f"local function {lib}(") < script.index(body.replace("JOURNAL_LIMIT", "7"))


def test_a_constant_the_script_does_not_use_is_refused() -> None:
    with pytest.raises(ValueError, match="does not use"):
        lua_script("view_read_ordered", constants={"JOURNAL_LIMIT": 1})
