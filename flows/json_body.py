"""What the project's HTTP servers (the gateway, the webhook) take as a JSON body, and what
the gateway takes from an upstream: JSON text that can be stored and sent on as it came.

Python's json module reads two things nothing after it can carry: the constants NaN and
Infinity (not JSON: the gateway's spool, httpx's encoder and DuckDB refuse them) and a
lone UTF-16 surrogate (`"\\ud800"`: a string cut between the two halves of an emoji, as
slicing in JavaScript does), which no UTF-8 encoder writes. Refused here, each is the
sender's error with its reason (400, or 502 from an upstream); let through, each became
the server's own 500 later, in the spool or in Prefect's client.
"""
from __future__ import annotations

import json
import re
from typing import Any

# A lone surrogate can only come from a \uD800-\uDFFF escape or from the bytes ED A0-BF
# (which Python's json decodes with `surrogatepass`); only bodies holding one are checked.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")


def parse_json_body(body: bytes) -> Any:
    """The parsed body; ValueError saying what is wrong when it is not JSON that can be sent on."""
    try:
        parsed = json.loads(body, parse_constant=_refuse_constant)
    except RecursionError:  # Python's parser recurses per level: a hostile body must not be a 500
        raise ValueError("JSON nested too deeply to read") from None
    if _MAYBE_SURROGATE.search(body):
        try:
            json.dumps(parsed, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is no text: "
                             "cut between the two halves of a character?") from None
    return parsed


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (numbers must be finite)")
