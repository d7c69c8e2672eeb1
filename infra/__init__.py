"""The local stack: Apache Kafka (KRaft, from Maven Central through ``kafka/pom.xml``) and redis-server
started as plain processes on loopback (``kafka_broker``, ``local_stack``), and ``docker-compose.yml``
for a stack in containers where Docker is available."""
