"""A plain, deterministic byte mutator (the engine when atheris is not used, and for Hypothesis).

Mutations aim at what breaks binary decoders: lengths and counts.  Besides
bit flips and byte edits it overwrites 1, 2, 4 or 8 bytes with boundary values
(0, -1, 0x7f.., 0x80.., small counts), inserts, deletes and duplicates runs, and
splices two inputs.
"""

from __future__ import annotations

import random
import struct

_INTERESTING = [
    b"\x00",
    b"\xff",
    b"\x7f",
    b"\x80",
    b"\x01",
    b"\x00\x00",
    b"\xff\xff",
    b"\x7f\xff",
    b"\x80\x00",
    b"\x00\x10",
    b"\x00\x00\x00\x00",
    b"\xff\xff\xff\xff",
    b"\x7f\xff\xff\xff",
    b"\x80\x00\x00\x00",
    b"\x00\x00\x10\x00",
    b"\xff\xff\xff\xff\x0f",  # a 5-byte varint
    b"\x80\x80\x80\x80\x80",  # a varint that never ends
    struct.pack(">q", -1),
    struct.pack(">q", 2**63 - 1),
]
MAX_SIZE = 64 * 1024


def mutate(data: bytes, rng: random.Random, other: bytes = b"", rounds: int = 0) -> bytes:
    """*data* with 1-4 random mutations (*other* is a second input to splice from)."""
    buf = bytearray(data)
    for _ in range(rounds or rng.randint(1, 4)):
        op = rng.randrange(8)
        n = len(buf)
        if op == 0 and n:  # flip a bit
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # set a byte
            buf[rng.randrange(n)] = rng.randrange(256)
        elif op == 2:  # overwrite with a boundary value
            value = rng.choice(_INTERESTING)
            i = rng.randrange(n + 1)
            buf[i : i + len(value)] = value
        elif op == 3 and n:  # delete a run
            i = rng.randrange(n)
            del buf[i : i + rng.randint(1, min(16, n - i))]
        elif op == 4:  # insert random bytes
            i = rng.randrange(n + 1)
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 5 and n:  # duplicate a run
            i = rng.randrange(n)
            j = min(n, i + rng.randint(1, 64))
            k = rng.randrange(n + 1)
            buf[k:k] = buf[i:j]
        elif op == 6 and other:  # splice
            cut = rng.randrange(len(buf) + 1)
            start = rng.randrange(len(other))
            buf[cut:] = other[start:]
        elif op == 7 and n:  # add a small delta to a 1/2/4-byte big-endian integer
            width = rng.choice([1, 2, 4])
            i = rng.randrange(n)
            if i + width <= n:
                value = int.from_bytes(buf[i : i + width], "big")
                value = (value + rng.choice([-2, -1, 1, 2, 16])) % (1 << (8 * width))
                buf[i : i + width] = value.to_bytes(width, "big")
    return bytes(buf[:MAX_SIZE])
