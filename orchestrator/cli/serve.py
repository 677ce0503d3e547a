"""``rolecast serve``: the model and its adapters over an OpenAI-compatible API."""
from __future__ import annotations

import argparse
import asyncio
from typing import Any

from .flags import add_model_flags, parse_adapter_flags


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the model and its adapters over an OpenAI-compatible API")
    add_model_flags(p, model_default="smollm2-135m", adapter_help="serve a PEFT-format adapter dir as model NAME (repeatable)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..engines.load import load_engine
    from ..serve import serve

    adapters = parse_adapter_flags(args.adapter)
    engine = load_engine(args.model, args.dtype, 0, args.engine, device=args.device)

    def ready(port: int) -> None:
        print(f"listening on http://{args.host}:{port}/v1", flush=True)

    try:
        asyncio.run(serve(engine, args.model, args.host, args.port, adapters, ready))
    except KeyboardInterrupt:
        pass
    return 0
