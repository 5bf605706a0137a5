"""Security: who a client is (TLS, SASL: ``tls.py``, ``sasl/``) and what it may do (ACLs and their
ZooKeeper JSON: ``acl.py``; the AclAuthorizer's decisions: ``authorizer.py``).

Every broker connection carries ``principal`` ("User:<name>", "User:ANONYMOUS" until authenticated),
``listener_name`` and ``client_host``; authentication sets the principal, authorization reads it.
"""
