"""Optional CURVE authentication and encryption with ZeroMQ's ZAP (`zmq.auth`) and key files.

Keys are ZeroMQ certificate files written by `generate_keypair` (`<name>.key` public, `<name>.key_secret`
secret). A service with `CurveServer` starts a ZAP authenticator on its own context that admits only the
clients whose public key file is in `authorized_keys_dir`; any other client fails the handshake and no
message of it reaches the service. A client with `CurveClient` must know the server's public key.

Policy shared by every service that binds (sandbox node, learner): `server_curve` turns CURVE on whenever the
endpoint is reachable beyond loopback (mode "auto"), refuses such a bind without keys, and says so loudly when
mode "never" serves beyond loopback unauthenticated. `init_keys` writes a server key pair and client key pairs.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Sequence

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger(__name__)

#: Values of a service's `curve` setting.
CURVE_MODES = ("auto", "always", "never")


def generate_keypair(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write a new CURVE key pair into `directory`; returns (public key file, secret key file)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    return Path(public), Path(secret)


@dataclasses.dataclass(frozen=True)
class CurveServer:
    """Server side: its secret key file, and the folder of authorised clients' public key files."""

    secret_key_file: Path
    authorized_keys_dir: Path

    def __post_init__(self) -> None:
        if not Path(self.secret_key_file).is_file():
            raise FileNotFoundError(f"CurveServer.secret_key_file: no file {self.secret_key_file}")
        if not Path(self.authorized_keys_dir).is_dir():
            raise FileNotFoundError(f"CurveServer.authorized_keys_dir: no folder {self.authorized_keys_dir}")

    def start_authenticator(self, ctx: zmq.Context) -> ThreadAuthenticator:
        """Run ZAP on `ctx` admitting only the keys in `authorized_keys_dir` (one per context)."""
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain="*", location=str(self.authorized_keys_dir))
        return auth

    def apply(self, sock: zmq.Socket) -> None:
        """Make `sock` a CURVE server (call before bind)."""
        public, secret = zmq.auth.load_certificate(self.secret_key_file)
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True


@dataclasses.dataclass(frozen=True)
class CurveClient:
    """Client side: its own secret key file and the server's public key file."""

    secret_key_file: Path
    server_public_key_file: Path

    def __post_init__(self) -> None:
        for name in ("secret_key_file", "server_public_key_file"):
            if not Path(getattr(self, name)).is_file():
                raise FileNotFoundError(f"CurveClient.{name}: no file {getattr(self, name)}")

    def apply(self, sock: zmq.Socket) -> None:
        """Make `sock` a CURVE client (call before connect)."""
        public, secret = zmq.auth.load_certificate(self.secret_key_file)
        server_public, _ = zmq.auth.load_certificate(self.server_public_key_file)
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = server_public


def is_loopback(endpoint: str) -> bool:
    """True for ipc:// and inproc:// endpoints and tcp:// on 127.0.0.0/8, ::1 or localhost."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")


def server_curve(endpoint: str, mode: str, secret_key: str, authorized_keys: str, *, who: str,
                 init_hint: str) -> CurveServer | None:
    """The CURVE keys a service binding `endpoint` must use, by the policy in the module doc.

    Args:
      endpoint: the bind address (e.g. "tcp://*:5555").
      mode: one of CURVE_MODES: "auto" (on beyond loopback), "always", "never".
      secret_key / authorized_keys: the server's `.key_secret` file and the folder of authorised public keys.
      who: the service's name for messages ("sandbox node", "learner").
      init_hint: the command that makes keys, for the error message.

    Returns None when CURVE is off. Raises ValueError (naming the endpoint and the settings to give) when CURVE is
    needed and keys are missing or `mode` is unknown; FileNotFoundError for key paths that do not exist.
    """
    if mode not in CURVE_MODES:
        raise ValueError(f"{who}: curve must be one of {CURVE_MODES}, got {mode!r}")
    local = is_loopback(endpoint)
    if mode == "never" or (mode == "auto" and local):
        if not local:
            log.warning("%s: %s is reachable beyond loopback WITHOUT authentication (curve=never)", who, endpoint)
        return None
    if not secret_key or not authorized_keys:
        raise ValueError(f"{who}: binding {endpoint} beyond loopback needs CURVE keys: set "
                         f"curve_secret_key=<dir>/server.key_secret and curve_authorized_keys=<dir>/clients "
                         f"({init_hint} makes them), or curve=never to serve without authentication")
    return CurveServer(Path(secret_key), Path(authorized_keys))


def client_curve(secret_key: str | Path | None, server_public_key: str | Path | None, *,
                 who: str) -> CurveClient | None:
    """`CurveClient` from the two key files, None when neither is given. Raises ValueError when only one is."""
    if not secret_key and not server_public_key:
        return None
    if not secret_key or not server_public_key:
        raise ValueError(f"{who}: CURVE needs both a client secret key file and the server's public key file")
    return CurveClient(Path(secret_key), Path(server_public_key))


def init_keys(directory: str | Path, clients: Sequence[str] = ("client",)) -> dict[str, str]:
    """Make CURVE keys for a server and its clients under `directory`: server.key / server.key_secret, and
    clients/<name>.key (the authorised public keys) with secrets in client-secrets/. Returns the paths
    (server_public_key, server_secret_key, authorized_keys, client_<name>_secret_key)."""
    d = Path(directory)
    pub, sec = generate_keypair(d, "server")
    out = {"server_public_key": str(pub), "server_secret_key": str(sec), "authorized_keys": str(d / "clients")}
    for name in clients:
        cpub, csec = generate_keypair(d / "client-secrets", name)
        (d / "clients").mkdir(parents=True, exist_ok=True)
        (d / "clients" / cpub.name).write_bytes(cpub.read_bytes())
        out[f"client_{name}_secret_key"] = str(csec)
    return out
