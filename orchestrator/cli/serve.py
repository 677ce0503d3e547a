"""``rolecast serve``: the model and its adapters over an OpenAI-compatible API."""
from __future__ import annotations

import argparse
import asyncio
import socket
from typing import Any

from ..errors import RolecastError
from .flags import add_model_flags, parse_adapter_flags


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 for any free one."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, got {value}")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the model and its adapters over an OpenAI-compatible API")
    add_model_flags(p, model_default="smollm2-135m", adapter_help="serve a PEFT-format adapter dir as model NAME (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000; 0 picks a free one)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..engines.load import load_engine
    from ..launch import adapter_dirs
    from ..serve import base_url, serve

    adapters = adapter_dirs(parse_adapter_flags(args.adapter))
    if taken := sorted(set(adapters) & {"base", args.model}):
        raise RolecastError(f"--adapter {taken[0]}: that name is the base model's; give the adapter another")
    _check_address(args.host, args.port)  # before the model loads: a busy port is one line, not minutes later
    engine = load_engine(args.model, args.dtype, 0, args.engine, adapters, device=args.device)

    def ready(port: int) -> None:
        print(f"listening on {base_url(args.host, port)}", flush=True)

    try:
        asyncio.run(serve(engine, args.model, args.host, args.port, adapters, ready))
    except KeyboardInterrupt:
        pass
    except OSError as exc:  # the address was taken between the check and the bind
        raise RolecastError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0


def _check_address(host: str, port: int) -> None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does
            probe.bind(infos[0][4])
    except OSError as exc:
        raise RolecastError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
