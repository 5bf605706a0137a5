"""The cluster controller (Kafka's ZooKeeper-mode KafkaController): runs inside the broker that wins
/controller, keeps partition leadership and ISR in ZooKeeper with fenced writes, and pushes
LeaderAndIsr / UpdateMetadata / StopReplica to the brokers. Imports nothing of kbroker.server."""
