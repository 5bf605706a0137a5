"""ZooKeeper for kbroker (installed as ``kbroker.zk``).

* ``kbroker.zk.local``: run a standalone ZooKeeper from Debian's package (tests, ``kbroker cluster up``).
* ``kbroker.zk.layout``: Kafka's classic znode paths and exact JSON payloads (pure functions).
* ``kbroker.zk.client``: ``BrokerZk``, one broker's ZooKeeper state over kazoo: cluster id,
  broker registration (re-created after session expiry), lone-broker controller election,
  topics/partition state/configs, producer-id blocks.
"""
