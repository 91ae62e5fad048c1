#!/bin/sh
# Formats the log directory on the first start (a restarted container keeps its data), then
# runs the broker in the foreground. Records are kept forever: a restarted stream must find
# every offset it has not read.
set -eu
cat > /opt/kafka/server.properties <<PROPERTIES
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:9093
listeners=PLAINTEXT://0.0.0.0:9092,CONTROLLER://127.0.0.1:9093
advertised.listeners=PLAINTEXT://${ADVERTISED}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=/var/lib/kafka
num.partitions=${PARTITIONS:-3}
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.ms=-1
PROPERTIES
java_main() { java "-Xmx${HEAP:-384m}" -cp '/opt/kafka/libs/*' "$@"; }
if [ ! -f /var/lib/kafka/meta.properties ]; then
  java_main kafka.tools.StorageTool format --standalone -t sparksinkkafkacluster0 \
    -c /opt/kafka/server.properties
fi
exec java "-Xmx${HEAP:-384m}" -cp '/opt/kafka/libs/*' kafka.Kafka /opt/kafka/server.properties
