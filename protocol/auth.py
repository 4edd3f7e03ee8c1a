"""Optional CURVE authentication and encryption with ZeroMQ's ZAP (`zmq.auth`) and key files.

Keys are ZeroMQ certificate files written by `generate_keypair` (`<name>.key` public, `<name>.key_secret`
secret). A service with `CurveServer` starts a ZAP authenticator on its own context that admits only the
clients whose public key file is in `authorized_keys_dir`; any other client fails the handshake and no
message of it reaches the service. A client with `CurveClient` must know the server's public key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator


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
