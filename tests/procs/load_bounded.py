"""GPT2.from_pretrained(CKPT) in an address space held to MIB more than the process has
after importing tblock: python load_bounded.py CKPT MIB.  Prints the error's type and
message (or "loaded"); a MemoryError is printed like any other."""

import resource
import sys

import tblock
from tblock.models.gpt2 import GPT2


def vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


if __name__ == "__main__":
    root, mib = sys.argv[1], int(sys.argv[2])
    tblock.GPT2                                         # every import done before the limit
    limit = vm_bytes() + mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        GPT2.from_pretrained(root)
        print("loaded")
    except Exception as e:
        print(f"{type(e).__name__}: {e}")
