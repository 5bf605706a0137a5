"""Request handlers, one module per API family. Each module's ``register(broker, handlers)`` adds its
handlers (``handler(conn, header, body) -> response dict | awaitable | NO_RESPONSE | CLOSE``) and
declares the versions ApiVersions advertises for them."""
