"""The peers' JVM jars, from Maven Central through the poms under ``poms/`` (``infra/maven_jars.py``).

Spark's Kafka connector must be built for the exact Spark version of the peer's pyspark, and Flink's for
the Flink release of its apache-flink: each pom names the version, and :func:`spark_jars` /
:func:`flink_jars` refuse a pom that disagrees with the pinned Python package.
"""

from __future__ import annotations

from pathlib import Path

from mvlog.infra.kafka_broker import find_java
from mvlog.infra.maven_jars import cache_folder, pom_property, resolve_jars

from .venvs import pinned_version

POMS = Path(__file__).resolve().parent / "poms"


def _jars(pom: Path, name: str, env_var: str, marker: str, what: str) -> list[Path]:
    home = cache_folder(env_var, name)
    libs = home / "libs"
    if not any(libs.glob(marker)):
        find_java()
        libs = resolve_jars(pom, home, what=what, env_var=env_var)
    return sorted(libs.glob("*.jar"))


def spark_jars() -> list[Path]:
    """spark-sql-kafka-0-10 of the peer's exact pyspark version and what it needs beyond pyspark's jars."""
    pom = POMS / "spark" / "pom.xml"
    version = pom_property(pom, "spark.version")
    pyspark = pinned_version("spark", "pyspark")
    if version != pyspark:
        raise ValueError(f"{pom} names Spark {version}, requirements/spark.txt pyspark {pyspark}: the Kafka "
                         "connector must be built for the exact Spark version")
    return _jars(pom, f"peers/spark-kafka-{version}", "MVLOG_PEER_SPARK_JARS", "spark-sql-kafka-0-10_*.jar",
                 "Spark's Kafka connector")


def flink_jars() -> list[Path]:
    """flink-sql-connector-kafka built for the peer's Flink release."""
    pom = POMS / "flink" / "pom.xml"
    version = pom_property(pom, "connector.version")
    flink = pinned_version("flink", "apache-flink")
    if version.rsplit("-", 1)[-1] != flink.rsplit(".", 1)[0]:
        raise ValueError(f"{pom} names connector {version}, built for another Flink release than apache-flink "
                         f"{flink} of requirements/flink.txt")
    return _jars(pom, f"peers/flink-kafka-{version}", "MVLOG_PEER_FLINK_JARS", "flink-sql-connector-kafka-*.jar",
                 "Flink's Kafka SQL connector")
