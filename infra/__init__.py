"""The processes mvlog runs beside itself, on loopback, without Docker.

- The local stack: Apache Kafka (KRaft) and redis-server as plain processes (``kafka_broker``,
  ``local_stack``); ``docker-compose.yml`` for a stack in containers where Docker is available.
- JVM components from Maven Central through a small pom each (``maven_jars``: ``kafka/pom.xml``,
  ``connect/pom.xml``, ``registry/pom.xml``), into a cache folder outside the work tree.
- A real CDC source for the tests: PostgreSQL (``postgres``) and Kafka Connect with Debezium's PostgreSQL
  connector (``kafka_connect``).
- A real Schema Registry for the tests of Avro sources: Apicurio Registry's Confluent-compatible API
  (``schema_registry``).
- ``child_processes``: children that do not outlive whoever started them.
"""
