"""Wire protocol between learner, actors and sandbox nodes (ZeroMQ + msgpack; see protocol/README.md).

Messages: `handshake` (Hello, Heartbeat, Error), `trajectory`, `weights`, `sandbox_jobs`; `codec` frames them,
`sockets` sends and receives them with bounds. Patterns: `trajectory_channel` (acked, durable `spool`),
`weights_channel` (credit-based chunk transfer), `rpc` (ROUTER/DEALER request/reply), `auth` (CURVE).
Nothing here imports jax or torch.
"""
