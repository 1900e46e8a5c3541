"""A bounded first contact with an object-store root, so a wrong one fails fast with the fix.

tensorstore retries an unreachable S3 or GCS store for minutes (its default is 32 retries with
backoff up to 32 s) and prints nothing a user reads: an `s3://` root given no endpoint, on a
machine that cannot reach AWS, hung over 120 s in silence. `check_reachable` reads the root's
`LEASE.json` once, through a store that retries briefly, under a time limit, and turns a failure
into a `CheckpointStorageError` that names the storage option to set.

Example:
    >>> check_reachable(storage.resolve("s3://bucket/run", {"endpoint": "http://127.0.0.1:9000"}))
"""

from __future__ import annotations

import tensorstore as ts

from . import layout, storage
from .errors import CheckpointStorageError

TIMEOUT_S = 30.0  # the longest a first contact may take (a cold DNS lookup, a region lookup)

# A few quick retries ride out a dropped connection; minutes of them only hide a wrong address.
_RETRIES = {"max_retries": 3, "initial_delay": "0.2s", "max_delay": "2s"}
_FIX = {
    "s3": "pass storage_options={'endpoint': 'http://HOST:PORT'} (and 'region' if the store needs "
    "one) or set FUNCTRAIN_S3_ENDPOINT; AWS itself needs network access and credentials",
    "gs": "check the network and the credentials (GOOGLE_APPLICATION_CREDENTIALS), or pass "
    "tensorstore's gcs options as storage_options",
}


def check_reachable(loc: storage.Location, timeout: float | None = None) -> None:
    """Raise unless the object store of `loc` answers a read within `timeout` seconds.

    Local and `memory://` locations are always reachable and are not contacted.

    Args:
        loc: the root's location.
        timeout: the limit in seconds (default `TIMEOUT_S`).
    Raises:
        CheckpointStorageError: the store failed or did not answer in time; the message names
            the missing or wrong option (for S3 without an endpoint: `endpoint`).
    Example:
        >>> check_reachable(storage.resolve("/runs/a"))  # local: nothing to check
    """
    if loc.scheme not in _FIX:
        return
    limit = TIMEOUT_S if timeout is None else timeout
    retries = "s3_request_retries" if loc.scheme == "s3" else "gcs_request_retries"
    try:
        store = ts.KvStore.open(loc.kvstore, context=ts.Context({retries: _RETRIES}))
        store.result(timeout=limit).read(layout.LEASE_FILE).result(timeout=limit)
    except TimeoutError:
        problem = f"did not answer within {limit:g} s"
    except Exception as err:  # tensorstore raises ValueError for every storage failure
        problem = f"failed: {err}"
    else:
        return
    where = loc.kvstore.get("endpoint")
    if loc.scheme == "s3" and not where:
        what = "no S3 endpoint was given, so AWS's default endpoint was tried, and it"
    elif loc.scheme == "s3":
        what = f"the S3 endpoint {where}"
    else:
        what = "Google Cloud Storage"
    raise CheckpointStorageError(
        f"the checkpoint root {loc.url} is unreachable: {what} {problem}; {_FIX[loc.scheme]}"
    )
