"""What the Python tests and benchmarks recompute from docs/spec.md the same way: the capacity of
docs/spec.md §2 item 3 in exact integers, and Parm's .npy dumps (`parm check-layer --dump DIR`).
Plain Python (no numpy, no torch), so every script can import it:

    sys.path.insert(0, os.path.join(<repo>, "tests", "lib"))
    from parm_testlib import capacity, read_npy
"""
import ast
import math
import re
import struct

# The .npy element types Parm writes -> struct codes.
NPY_TYPES = {"<f4": "f", "<f8": "d", "<i4": "i", "|u1": "B"}


def parse_factor(text):
    """A positive decimal as (p, q), q a power of ten: '1.2' -> (12, 10); exact, as Parm."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        raise ValueError(f"capacity factor '{text}' is not a decimal like 1, 1.25 or 0.5")
    whole, _, frac = text.partition(".")
    p, q = int(whole + frac), 10 ** len(frac)
    if p == 0:
        raise ValueError(f"capacity factor '{text}' must be > 0")
    return p, q


def capacity(k, factor, tokens, experts):
    """C = ceil(k f T / E) in integers, f the exact decimal string it was written as
    (ceil(1.1 * 3000 / 4) is 825, not 826)."""
    p, q = parse_factor(factor)
    return -(-(k * p * tokens) // (q * experts))


def read_npy_raw(path):
    """(shape, descr, body bytes) of a little-endian C-order .npy file of a type in
    NPY_TYPES; ValueError for anything else."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    if data[6] == 1:
        hlen, off = struct.unpack("<H", data[8:10])[0], 10
    else:
        hlen, off = struct.unpack("<I", data[8:12])[0], 12
    header = ast.literal_eval(data[off:off + hlen].decode("latin1"))
    if header["fortran_order"] or header["descr"] not in NPY_TYPES:
        raise ValueError(f"{path}: unsupported .npy header {header}")
    return tuple(header["shape"]), header["descr"], data[off + hlen:]


def read_npy(path):
    """(shape, flat list) of a little-endian C-order .npy file."""
    shape, descr, body = read_npy_raw(path)
    n = math.prod(shape)
    code = NPY_TYPES[descr]
    return shape, list(struct.unpack(f"<{n}{code}", body[:n * struct.calcsize(code)]))
