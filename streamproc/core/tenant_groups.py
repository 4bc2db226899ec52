"""Which group of requests topics a tenant's requests are written on (design §5.11, tenant groups).

A deployment may split each priority's requests topic into ``N`` groups; a tenant's requests all go on one of them,
so a flood of one tenant fills its own topic's partitions and a tenant in another group is not read behind it. A
tenant is pinned to a group by name, else hashed (CRC-32, the same in every process and release); the default
tenant (records of a producer of its own that names none) is in group 0, the topic such a producer writes.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

from streamproc.core.tenancy import DEFAULT_TENANT


def tenant_group(tenant: str, groups: int, pinned: Mapping[str, int]) -> int:
    """The group (``0 <= group < groups``) of ``tenant``'s requests topics."""
    if groups <= 1 or tenant == DEFAULT_TENANT:
        return 0
    if tenant in pinned:
        return pinned[tenant]
    return zlib.crc32(tenant.encode("utf-8")) % groups


def pinning_problem(groups: int, pinned: Mapping[str, int]) -> str | None:
    """Why ``pinned`` cannot be used with ``groups`` groups, or None."""
    outside = sorted(tenant for tenant, group in pinned.items() if not 0 <= group < groups)
    if outside:
        return f"tenants {outside} are pinned outside groups 0..{groups - 1}"
    if DEFAULT_TENANT in pinned and pinned[DEFAULT_TENANT] != 0:
        return f"the default tenant {DEFAULT_TENANT!r} is always in group 0"
    return None
