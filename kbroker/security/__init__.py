"""What a principal may do: ACLs and their ZooKeeper JSON (``acl.py``), the AclAuthorizer's decisions
(``authorizer.py``). Who the client is (TLS, SASL) is decided elsewhere and arrives as the connection's
``principal``, ``listener_name`` and ``client_host``."""
