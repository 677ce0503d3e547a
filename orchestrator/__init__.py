"""rolecast: teams of LLM roles that learn together."""
import structlog as _structlog

from . import logs as _logs

# Log lines go to stderr, as the commands' do, unless the caller has set structlog up: structlog's
# own default prints to stdout, where a script's results go (the benchmarks' JSON line, say).
if not _structlog.is_configured():
    _logs.configure()
