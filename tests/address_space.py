"""A test guard against runaway allocations: a bounded address space for one block."""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator


@contextlib.contextmanager
def address_space_limited(extra_bytes: int) -> Iterator[None]:
    """This process may map at most ``extra_bytes`` more while the block runs: a runaway
    allocation raises MemoryError in the block instead of the kernel killing the whole
    test run (and a test can assert that code stays within a budget)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as status:
        vm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    limit = vm_kb * 1024 + extra_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
